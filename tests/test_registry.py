"""encoding.registry: the one name -> object table of models, datasets, losses, strategies and balancers."""
import pytest

from encoding.registry import Registry


def test_register_get_names_and_the_one_message():
    table = Registry("widget", {"a": 1})
    assert table.register("b", 2) == 2

    @table.register("c")
    def c():
        return 3

    assert table.names() == ["a", "b", "c"] and table.get("c") is c and table["a"] == 1
    assert table.get("z", None) is None  # a default: dict-like
    with pytest.raises(ValueError, match=r"^unknown widget 'z'; valid: a, b, c$"):
        table.get("z")
    with pytest.raises(ValueError, match="widget 'a' is already registered"):
        table.register("a", 9)
    assert table["a"] == 1
    assert Registry("thing").unknown("x") == "unknown thing 'x'; valid: none registered"


def test_every_registry_of_the_package_is_one_and_says_the_same():
    import encoding
    from encoding.engine.builders import STRATEGIES
    from encoding.parallel import planners

    registries = {"segmentation model": encoding.models.ARCHITECTURES, "dataset": encoding.datasets.datasets,
                  "loss": encoding.nn.LOSSES, "strategy": STRATEGIES, "balancer": planners._BALANCERS}
    for kind, table in registries.items():
        assert isinstance(table, Registry) and table.kind == kind and table.names()
        with pytest.raises(ValueError, match=rf"^unknown {kind} 'nosuch'; valid: {table.names()[0]}"):
            table.get("nosuch")
    assert "memory" in planners.registered_balancers()
    with pytest.raises(ValueError, match=r"unknown loss 'tversky'; valid: ce, ohem"):
        encoding.engine.builders.build_criterion(3, loss="tversky")
    assert encoding.engine.builders.strategy_problem("nosuch") == (
        "--strategy nosuch: unknown strategy 'nosuch'; valid: ddp, fsdp, zero1")
