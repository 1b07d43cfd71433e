"""Reading compiled HLO text: computations, instructions, array types, and while-loop trip counts.

``compiled.as_text()`` is the program the chip will run, scheduled: within a
computation the instructions are listed in execution order. This module only
parses; ``sweeps.preflight.hlo_cost`` prices the instructions.

Trip counts. A compiled while loop says how often it runs in one of two
places: XLA:CPU and XLA:GPU put ``known_trip_count`` in the loop's
``backend_config``; TPU-compiled programs do not, and the count is in the
loop itself: the condition computation is ``compare(i, constant(N)),
direction=LT`` on one element of the loop's tuple, the loop's initial tuple
sets that element to a constant (usually through a ``copy``), and the body
adds a constant to it. ``trip_count`` reads either form and returns None for
any other loop, which the caller must then report as uncounted rather than
guess.

Re-pricing (``sweeps.preflight.layer_loop``): inside ``with trip_counts({loop: n})``
``trip_count`` answers ``n`` for the while loops named there, so any cost
walk prices the same program as if those loops ran ``n`` times.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
import re

DTYPE_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3": 1,
               "f8e4m3fnuz": 1, "f8e5m2fnuz": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4,
               "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
# dtype[dims] with an optional layout {minor_to_major:tiling S(memory space)}.
_ARRAY = re.compile(r"\b(" + "|".join(DTYPE_BYTES) + r")\[([\d,]*)\](\{[^}]*\})?")
_MEMORY_SPACE = re.compile(r"S\((\d+)\)")
_INSTRUCTION = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s([a-z][a-z0-9\-]*)\((.*)$")
_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_CALLED = re.compile(r"\b(calls|body|condition|to_apply|true_computation|false_computation|"
                     r"branch_computations|async_computation)=\{?(%?[\w.\-]+(?:,\s*%[\w.\-]+)*)\}?")
_KNOWN_TRIP_COUNT = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)')
_OVERRIDES: contextvars.ContextVar[dict] = contextvars.ContextVar("trip_count_overrides", default={})
_PASS_THROUGH = ("copy", "bitcast", "reshape", "convert")  # ops that carry a loop counter's value unchanged


@dataclasses.dataclass(frozen=True)
class Array:
    """One array of an HLO type: element type, dimensions and memory space (0: HBM; on TPU 1 is on-chip VMEM)."""

    dtype: str
    dims: tuple[int, ...]
    memory_space: int = 0

    @property
    def nbytes(self) -> float:
        return DTYPE_BYTES[self.dtype] * math.prod(self.dims)

    @property
    def elements(self) -> int:
        return math.prod(self.dims)


def arrays(type_text: str) -> list[Array]:
    """Every array of an HLO type, in order (a tuple type lists several)."""
    found = []
    for dtype, dims, layout in _ARRAY.findall(type_text):
        space = _MEMORY_SPACE.search(layout or "")
        found.append(Array(dtype, tuple(int(d) for d in dims.split(",") if d), int(space.group(1)) if space else 0))
    return found


@dataclasses.dataclass
class Instruction:
    """One HLO instruction: ``name = type opcode(operands), attributes``."""

    name: str
    type_text: str
    opcode: str
    operand_text: str
    attributes: str
    is_root: bool = False

    @property
    def operands(self) -> list[str]:
        return re.findall(r"%([\w.\-]+)", self.operand_text)

    @property
    def arrays(self) -> list[Array]:
        return arrays(self.type_text)

    def called(self) -> list[tuple[str, str]]:
        """(role, computation name) of every computation this instruction calls (``calls``, ``body``, ...)."""
        return [(role, callee.strip().lstrip("%")) for role, names in _CALLED.findall(self.attributes)
                for callee in names.split(",")]

    def attribute(self, key: str) -> str | None:
        match = re.search(r"\b" + re.escape(key) + r"=([^,\s]+)", self.attributes)
        return match.group(1) if match else None


@dataclasses.dataclass
class Computation:
    name: str
    instructions: list[Instruction]
    is_entry: bool = False

    def __post_init__(self):
        self.by_name = {instruction.name: instruction for instruction in self.instructions}

    @property
    def root(self) -> Instruction | None:
        return next((i for i in self.instructions if i.is_root), self.instructions[-1] if self.instructions else None)

    def users(self, name: str) -> list[Instruction]:
        return [i for i in self.instructions if name in i.operands]


def _split_operands(rest: str) -> tuple[str, str]:
    """``a, b), attrs`` -> (``a, b``, ``attrs``): the operand list ends at the first unmatched ``)``."""
    depth = 0
    for index, char in enumerate(rest):
        if char in "({[":
            depth += 1
        elif char in ")}]":
            if depth == 0:
                return rest[:index], rest[index + 1:].lstrip(", ")
            depth -= 1
    return rest, ""


@dataclasses.dataclass
class Module:
    computations: dict[str, Computation]
    entry: str | None

    def computation(self, name: str) -> Computation | None:
        return self.computations.get(name)


def parse(hlo_text: str) -> Module:
    """Split compiled HLO text into computations of instructions (in their scheduled order)."""
    computations, entry, current, lines = {}, None, None, []
    for line in hlo_text.splitlines():
        if current is None:
            match = _COMPUTATION.match(line)
            if match and "=" not in line.split("(")[0]:
                current, lines = match.group(2), []
                if match.group(1):
                    entry = current
            continue
        if line.strip() == "}":
            computations[current] = Computation(current, lines, current == entry)
            current = None
            continue
        match = _INSTRUCTION.match(line)
        if match:
            root, name, type_text, opcode, rest = match.groups()
            operand_text, attributes = _split_operands(rest)
            lines.append(Instruction(name, type_text, opcode, operand_text, attributes, bool(root)))
    return Module(computations, entry)


# ---------------------------------------------------------------------------
# Trip counts


def _constant(computation: Computation, name: str) -> int | None:
    """The integer a scalar instruction holds, following copies and converts back to a ``constant``."""
    instruction = computation.by_name.get(name)
    for _ in range(8):
        if instruction is None:
            return None
        if instruction.opcode == "constant":
            try:
                return int(instruction.operand_text.strip())
            except ValueError:
                return None
        if instruction.opcode not in _PASS_THROUGH or len(instruction.operands) != 1:
            return None
        instruction = computation.by_name.get(instruction.operands[0])
    return None


def _tuple_index(computation: Computation, name: str, parameter: str | None = None) -> int | None:
    """k when ``name`` is ``get-tuple-element(parameter), index=k`` (through pass-through ops)."""
    instruction = computation.by_name.get(name)
    while instruction is not None and instruction.opcode in _PASS_THROUGH and len(instruction.operands) == 1:
        instruction = computation.by_name.get(instruction.operands[0])
    if instruction is None or instruction.opcode != "get-tuple-element":
        return None
    source = computation.by_name.get(instruction.operands[0]) if instruction.operands else None
    if source is None or source.opcode != "parameter" or (parameter and source.name != parameter):
        return None
    index = instruction.attribute("index")
    return int(index) if index is not None and index.isdigit() else None


def _tuple_element(computation: Computation, name: str, index: int) -> str | None:
    """The operand that sets element ``index`` of the tuple built by ``name``."""
    instruction = computation.by_name.get(name)
    if instruction is None or instruction.opcode != "tuple" or index >= len(instruction.operands):
        return None
    return instruction.operands[index]


_COMPARISONS = {"LT": lambda start, bound, step: -(-(bound - start) // step) if step > 0 else None,
                "LE": lambda start, bound, step: (bound - start) // step + 1 if step > 0 else None,
                "GT": lambda start, bound, step: -(-(start - bound) // -step) if step < 0 else None,
                "GE": lambda start, bound, step: (start - bound) // -step + 1 if step < 0 else None}
_MIRRORED = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE"}


@contextlib.contextmanager
def trip_counts(overrides: dict[str, int]):
    """Within the block, ``trip_count`` of the while loops named in ``overrides`` (instruction names) is theirs."""
    token = _OVERRIDES.set({**_OVERRIDES.get(), **overrides})
    try:
        yield
    finally:
        _OVERRIDES.reset(token)


def trip_count(module: Module, caller: Computation, loop: Instruction) -> int | None:
    """How many times the while ``loop`` (an instruction of ``caller``) runs its body; None if unreadable.

    ``known_trip_count`` in the loop's backend config when the compiler wrote
    it; otherwise the counter loop described in the module docstring:
    ``compare(counter, constant(N))`` in the condition, the counter's initial
    value a constant in the loop's operand tuple, and ``counter + constant(s)``
    in the body's result tuple. Loops named in an active ``trip_counts`` block get the count given there.
    """
    overridden = _OVERRIDES.get().get(loop.name)
    if overridden is not None:
        return overridden
    known = _KNOWN_TRIP_COUNT.search(loop.attributes)
    if known:
        return int(known.group(1))
    roles = dict(loop.called())
    condition, body = module.computation(roles.get("condition", "")), module.computation(roles.get("body", ""))
    if condition is None or body is None or len(loop.operands) != 1:
        return None
    compare = condition.root
    direction = re.search(r"direction=(\w+)", compare.attributes) if compare else None
    if compare is None or compare.opcode != "compare" or not direction or len(compare.operands) != 2:
        return None
    direction = direction.group(1)
    left, right = compare.operands
    index, bound = _tuple_index(condition, left), _constant(condition, right)
    if index is None or bound is None:  # constant on the left: mirror the comparison
        index, bound, direction = _tuple_index(condition, right), _constant(condition, left), _MIRRORED.get(direction)
    if index is None or bound is None or direction not in _COMPARISONS:
        return None
    start_name = _tuple_element(caller, loop.operands[0], index)
    start = _constant(caller, start_name) if start_name else None
    update_name = _tuple_element(body, body.root.name, index) if body.root else None
    update = body.by_name.get(update_name) if update_name else None
    if start is None or update is None or update.opcode not in ("add", "subtract") or len(update.operands) != 2:
        return None
    step = None
    orders = [update.operands] if update.opcode == "subtract" else [update.operands, update.operands[::-1]]
    for counter, increment in orders:  # counter - constant, or counter + constant either way round
        if _tuple_index(body, counter) == index and _constant(body, increment) is not None:
            step = _constant(body, increment) * (1 if update.opcode == "add" else -1)
            break
    if not step:
        return None
    count = _COMPARISONS[direction](start, bound, step)
    return None if count is None else max(0, count)
