#!/usr/bin/env python3
"""ctest layers.one_way: the folders of include/xtrain form a ladder, and every include points down.

A header may include headers of its own folder and of folders on lower rungs, never of a folder on
its own rung or above (docs/design.md, "The ladder", draws it). A folder that is not on the ladder
fails too: place it before adding headers to it.

Usage: check_ladder.py INCLUDE_DIR   (the folder that holds xtrain/)
"""
import pathlib
import re
import sys

# Lowest rung first. The root headers (version.hpp, xtrain.hpp) are named as folders are.
LADDER = [
    ("core", "version.hpp"),                      # tensors, memory, errors and exit codes, modules, recorder
    ("backend",),                                 # executors, thread pools: where loops run, where memory is
    ("kernels",),                                 # CPU kernels, each with a scalar twin
    ("layers", "loss", "optim", "precision"),     # what a model, a loss, an optimizer and a precision are
    ("parallel", "lowering"),                     # communicators, gradient sync; models lowered onto a device
    ("checkpoint",),                              # archives, safetensors, the collective save/load
    ("data",),                                    # datasets, loaders
    ("train",),                                   # engine, trainer, accelerator
    ("profile", "testing"),                       # tools: profile report, memory estimate, gradcheck
    ("xtrain.hpp",),                              # the umbrella
]
RUNG = {name: level for level, names in enumerate(LADDER) for name in names}
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]xtrain/([^">]+)[">]')


def unit(relative):
    """The ladder name of a header path relative to include/xtrain: its top folder, or the file."""
    return relative.split("/", 1)[0]


def main():
    root = pathlib.Path(sys.argv[1]) / "xtrain"
    problems, headers, edges = [], 0, set()
    for path in sorted(root.rglob("*.hpp")):
        relative = path.relative_to(root).as_posix()
        mine = unit(relative)
        headers += 1
        if mine not in RUNG:
            problems.append(f"{relative}: '{mine}' is not on the ladder (add it to LADDER in {sys.argv[0]} "
                            "and to docs/design.md)")
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            theirs = unit(m.group(1))
            if theirs == mine:
                continue
            if theirs not in RUNG:
                problems.append(f"{relative}:{number}: includes xtrain/{m.group(1)}, which is not on the ladder")
            elif RUNG[theirs] >= RUNG[mine]:
                where = "the same rung as" if RUNG[theirs] == RUNG[mine] else "a rung above"
                problems.append(f"{relative}:{number}: {mine}/ includes xtrain/{m.group(1)}: '{theirs}' is on "
                                f"{where} '{mine}' (includes must point down the ladder)")
            else:
                edges.add((mine, theirs))
    for p in problems:
        print("FAIL:", p)
    print(f"{headers} headers, {len(edges)} folder-to-folder edges, {len(problems)} upward or sideways includes")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
