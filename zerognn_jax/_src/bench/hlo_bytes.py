"""Bytes each instruction of a compiled XLA program moves, estimated from its HLO text.

An instruction outside fused computations (a fusion, a library call such as a GEMM, a
copy) moves its operands and its result once. Two refinements follow what the fused
code reads and writes:

- an operand that the fused computation only gathers from (or dynamic-slices) counts
  the rows read, the sizes of those gathers' results, not the whole table;
- a fusion whose root is a scatter updates its operand in place: that operand counts
  nothing, and the target rows the updates touch count twice (read, then written).

The figure ignores caches (a row read twice counts twice) and reduction passes inside
a kernel; `benchmarks/step_forms.py` puts it beside measured kernel times.
"""

from __future__ import annotations

import math
import re

_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
                "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8}
_ARRAY = re.compile(r"\b(" + "|".join(_DTYPE_BYTES) + r")\[([0-9,]*)\]")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_HEADER = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s*(?:\(.*\))?\s*(?:->.*)?\{\s*$")
_READS_PART = ("gather", "dynamic-slice")


def shape_bytes(text: str) -> int:
    """Total bytes of every array shape written in `text` (e.g. "(f32[2,3], s32[4])")."""
    return sum(_DTYPE_BYTES[t] * math.prod(int(d) for d in dims.split(",") if d)
               for t, dims in _ARRAY.findall(text))


def _closing(text: str, start: int) -> int:
    """Index of the parenthesis closing the one at `start`."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i
    raise ValueError(f"unbalanced parentheses in HLO line: {text[:120]!r}")


def _split_top(text: str) -> list[str]:
    """`text` split at the commas outside brackets and braces."""
    parts, depth, cur = [], 0, []
    for ch in text:
        depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur))
    return parts


def parse_instruction(line: str) -> dict | None:
    """{"name", "shape", "opcode", "operands": [names], "attrs"} of one HLO instruction
    line, or None for other lines. An operand written with its shape keeps the name."""
    m = _INSTR.match(line)
    if not m:
        return None
    name, rest = m.groups()
    if rest.startswith("("):
        end = _closing(rest, 0) + 1
        shape, rest = rest[:end], rest[end:].lstrip()
    else:
        shape, _, rest = rest.partition(" ")
    opcode, paren, rest = rest.partition("(")
    if not paren or not re.fullmatch(r"[\w\-]+", opcode):
        return None
    end = _closing("(" + rest, 0)
    operands = []
    for part in _split_top(rest[:end - 1]):
        operands.append(part.strip().rsplit(" ", 1)[-1].lstrip("%"))
    return {"name": name, "shape": shape, "opcode": opcode, "operands": operands,
            "attrs": rest[end:]}


def computations(hlo_text: str) -> dict[str, list[dict]]:
    """{computation name: its parsed instructions}."""
    out, current = {}, None
    for line in re.sub(r"/\*.*?\*/", "", hlo_text).splitlines():  # drop /*index=5*/
        header = _HEADER.match(line)
        if header and "=" not in line.split("{")[0]:
            current = out.setdefault(header.group(1), [])
            continue
        if line.strip() == "}":
            current = None
            continue
        if current is not None:
            instr = parse_instruction(line)
            if instr is not None:
                current.append(instr)
    return out


def _fused_bytes(instr: dict, body: list[dict]) -> int:
    shapes = {i["name"]: i["shape"] for i in body}
    params = {i["name"]: int(i["operands"][0]) for i in body if i["opcode"] == "parameter"}
    uses: dict[str, list] = {p: [] for p in params}
    for i in body:
        for pos, operand in enumerate(i["operands"]):
            if operand in uses:
                uses[operand].append((pos, i))
    root = body[-1]
    scattered = root["operands"][0] if root["opcode"] == "scatter" else None
    total = 0
    for pname, index in params.items():
        reads = uses[pname]
        if pname == scattered or index >= len(instr["operands"]):
            continue
        if reads and all(pos == 0 and i["opcode"] in _READS_PART for pos, i in reads):
            total += min(shape_bytes(shapes[pname]),
                         sum(shape_bytes(i["shape"]) for _, i in reads))
        else:
            total += shape_bytes(shapes[pname])
    if scattered is not None:
        return total + 2 * shape_bytes(shapes[root["operands"][2]])
    return total + shape_bytes(instr["shape"])


_FREE = ("parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while",
         "conditional", "call", "after-all", "partition-id", "replica-id")


def instruction_bytes(hlo_text: str) -> dict[str, int]:
    """{instruction name: estimated bytes moved per execution} for every instruction
    outside fused computations that runs on the device (module docstring)."""
    comps = computations(hlo_text)
    inner = {m for body in comps.values() for i in body
             for m in re.findall(r"(?:calls|to_apply)=%?([\w.\-]+)", i["attrs"])}
    out = {}
    for name, body in comps.items():
        if name in inner:
            continue
        shapes = {i["name"]: i["shape"] for i in body}
        for i in body:
            if i["opcode"] in _FREE:
                continue
            m = re.search(r"calls=%?([\w.\-]+)", i["attrs"])
            if i["opcode"] == "fusion" and m and m.group(1) in comps:
                out[i["name"]] = _fused_bytes(i, comps[m.group(1)])
            else:
                out[i["name"]] = (sum(shape_bytes(shapes.get(o, "")) for o in i["operands"])
                                  + shape_bytes(i["shape"]))
    return out


def kernel_key(name: str) -> str:
    """A name as profiles spell kernels: XLA names a fusion's kernel after the
    instruction, with "." and "-" turned into "_"."""
    return re.sub(r"[.\-]", "_", name)
