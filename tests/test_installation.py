"""docs/installation.md tells the truth about setup.py: its table of extras lists every extra and what it adds."""
import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def setup_extras(path=os.path.join(ROOT, "setup.py")):
    """``extras_require`` of the ``setup(...)`` call of ``setup.py``, read from its source (nothing is run)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setup"]
    assert len(calls) == 1, "setup.py has one setup(...) call"
    keyword = next(k for k in calls[0].keywords if k.arg == "extras_require")
    return ast.literal_eval(keyword.value)


def documented_extras(path=os.path.join(ROOT, "docs", "installation.md")):
    """The rows of the ``## Extras`` table of ``docs/installation.md``: extra -> the packages it adds."""
    with open(path, encoding="utf-8") as f:
        section = f.read().split("## Extras", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([\w-]+)` \| ([^|]+) \|", section, flags=re.MULTILINE)
    assert rows, "docs/installation.md has an extras table"
    return {name: [p.strip() for p in adds.split(",")] for name, adds in rows}


def test_the_extras_table_lists_every_extra_of_setup_py_and_its_packages():
    declared, documented = setup_extras(), documented_extras()
    assert {"app", "hub", "test", "prepare"} <= set(declared)
    assert sorted(documented) == sorted(declared), "extras missing from / unknown to docs/installation.md"
    for name, packages in declared.items():
        assert sorted(documented[name]) == sorted(packages), name


def test_the_check_reads_a_table_that_misses_an_extra(tmp_path):
    page = tmp_path / "installation.md"
    page.write_text("# Installation\n\n## Extras\n\n| extra | adds | for |\n|---|---|---|\n"
                    "| `docs` | sphinx, furo | pages |\n\n## Next\n\n| `app` | gradio | not the table |\n")
    assert documented_extras(str(page)) == {"docs": ["sphinx", "furo"]}
    setup = tmp_path / "setup.py"
    setup.write_text("from setuptools import setup\nsetup(name='x', extras_require={'docs': ['sphinx'], "
                     "'app': ['gradio']})\n")
    assert setup_extras(str(setup)) == {"docs": ["sphinx"], "app": ["gradio"]}
