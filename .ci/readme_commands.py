"""Print the shell commands of README.md's ```bash blocks up to and including the documentation build, one per
line, in order (continuation lines joined): what `.ci/run` runs, as a newcomer pastes them.

Usage: python3 .ci/readme_commands.py README.md
"""
import re
import sys

FENCE = re.compile(r"^```(\w*)\s*$")


def commands(text: str):
    """The commands of the ```bash blocks of ``text`` until the one that builds the docs (``sphinx``)."""
    found, block = [], None
    for line in text.splitlines():
        fence = FENCE.match(line.strip())
        if fence and block is None:
            block = [] if fence.group(1) in ("bash", "sh", "shell") else False
            continue
        if fence:  # the closing fence
            if block:
                joined = "\n".join(block).replace("\\\n", " ")
                found += [c.split("#", 1)[0].strip() for c in joined.splitlines() if c.split("#", 1)[0].strip()]
                if any("sphinx" in c for c in found):
                    return found
            block = None
            continue
        if block is not False and block is not None:
            block.append(line)
    return found


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        print("\n".join(commands(f.read())))
