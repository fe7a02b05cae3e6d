"""A generated 5,000-line training script for the main-guard benchmark.

Shaped like a real one: helper functions and classes at the top, module-level constants, and
``if __name__ == "__main__":`` at the bottom, where the timing runs (``detect_main_guard()``
called from the guarded module-level line, as ``resolve()`` calls it). It also reports a
whole-file ``ast.parse`` of itself (what detection cost before its fast path) and checks that
the fast path found the same guard spans as that whole parse.
"""

from __future__ import annotations

GUARD = """
if __name__ == "__main__":
    import ast, json, statistics, sys, time
    from hwlaunch.planning import mainguard

    start = time.perf_counter()
    found = mainguard.detect_main_guard()
    first = time.perf_counter() - start
    cached = []
    for _ in range(200):
        start = time.perf_counter()
        mainguard.detect_main_guard()
        cached.append(time.perf_counter() - start)
    source = open(__file__).read()
    start = time.perf_counter()
    tree = ast.parse(source)
    whole = time.perf_counter() - start
    same = mainguard._analyse(source)[0] == tuple(mainguard._guard_bodies(tree.body))
    print("BENCH-JSON " + json.dumps({
        "status": found.status, "first": first, "cached": statistics.median(cached),
        "whole_parse": whole, "same_spans": same, "lines": source.count("\\n"),
    }))
"""


def generate(lines: int = 5000) -> str:
    """The script's source: ``lines`` lines, the guard block last."""
    out = ['"""A generated training script (hwlaunch benchmark)."""', "import os", "import sys", ""]
    out += ["def keep(obj):", "    return obj", ""]
    guard = GUARD.strip("\n").split("\n")
    i = 0
    while len(out) < lines - len(guard) - 12:
        i += 1
        out += [
            f"def helper_{i}(x, y=3):",
            f'    """Helper {i}: a docstring, # not a comment."""',
            f"    total = x * {i} + y  # a comment with 'quotes'",
            "    for k in range(3):",
            "        if k % 2:",
            f"            total += k * {i}",
            "        else:",
            "            total -= 1",
            "    return {'value': total, 'name': f'h{total}', 'items': [1, 2, 3]}",
            "",
        ]
        if i % 5 == 0:
            out += [
                "@keep",
                f"class Model{i}:",
                f"    scale = {i}",
                "",
                "    def forward(self, x):",
                "        return [v * self.scale for v in x]",
                "",
                f"CONST_{i} = helper_{i}(1)",
                "",
            ]
    out += ["def main():", "    return 0", ""]
    out += [""] * (lines - len(out) - len(guard))
    return "\n".join(out + guard) + "\n"
