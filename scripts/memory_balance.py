"""Peak memory per device of a training step under each data-parallel strategy (simulated or measured).

    python scripts/memory_balance.py --model encnet --backbone resnet50 --dataset ade20k --aux --se-loss \
        --simulate 8 --batch-size 16 --max-batch          # no GPU needed
    python scripts/memory_balance.py --devices 0,1,2,3 --model fcn --aux   # measured on GPUs

See docs/memory.md; the logic lives in encoding/tools/memory_balance.py.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from encoding.tools.memory_balance import main  # noqa: E402

if __name__ == "__main__":
    main()
