"""One compiled program priced at another depth: what one more layer adds to every figure of a preflight row.

With ``model.scan_layers`` the layers are one ``while`` loop over stacked
weights (two in a train step: the forward scan and the backward one), so
programs that differ only in depth differ only in that loop's trip count
and in the leading dimension of the stacked arrays. Every figure the
preflight reads from a compiled program is a sum over its ops with loops
counted their trip count times (``sweeps.preflight.hlo_cost``; the corrected
roofline and the compiler's estimate replay the same walk), so a figure at
depth L' is the compiled one plus (L' - L) times the layer loop's share.
``per_layer`` measures that share by pricing the same compiled program once
more with the layer loops run L + 1 times (``sweeps.preflight.hlo.trip_counts``).

Memory per chip: the stacked arguments (parameters and optimizer state, each
float array of the entry computation whose leading dimension is the depth)
grow by their per-layer bytes, tile padding included, and so do the stacks
the layer loops carry besides them in HBM (the activations saved for the
backward pass, the weights cast to the compute type:
``stacked_temporary_bytes``); the other temporaries (the logits, mostly) do
not depend on depth. Gradients that are not carried through the loop are
left out. Whether a sweep fits is not decided here: the runs no other run
dominates in depth and width are compiled (``sweeps.preflight.quick``).

Which loops are the layer loops: those whose trip count is the model's
depth and whose loop state carries a float array with the depth as leading
dimension (the stacked weights or their gradients). A program with none
(``scan_layers=False``, or a compiler that unrolled the scan) cannot be
re-priced: ``per_layer`` is None and the preflight compiles such runs.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable

from sweeps.preflight import hlo
from sweeps.preflight.roofline_corrections import padded_dims

# Row fields that are sums over the program's ops (or its buffers), so linear in the layer loop's trip count.
LINEAR_FIELDS = ("flops", "hbm_bytes_accessed", "collective_bytes", "estimated_step_seconds", "compute_seconds",
                 "memory_seconds", "collective_seconds", "exposed_collective_seconds",
                 "roofline_corrected_step_seconds", "corrections", "compiler_step_seconds",
                 "compiler_cycles_seconds", "compiler_ops_estimated", "compiler_ops_not_estimated", "collectives",
                 "kernels_analytic")
MEMORY_FIELDS = ("hbm_bytes_per_device", "argument_bytes", "compiler_peak_bytes")
_FLOATS = ("bf16", "f16", "f32", "f64")
_CYCLES = re.compile(r'("estimated_cycles"\s*:\s*"?)(\d+)')


def _stacked_arguments(module: hlo.Module, depth: int) -> list[tuple[str, tuple, str]]:
    """(dtype, dims, layout) of the entry's float arguments with ``depth`` as leading dimension: the stacked
    weights and their optimizer state."""
    entry = module.computation(module.entry) if module.entry else None
    found = []
    for instruction in entry.instructions if entry else []:
        if instruction.opcode != "parameter":
            continue
        for dtype, dims_text, layout in hlo._ARRAY.findall(instruction.type_text):
            dims = tuple(int(d) for d in dims_text.split(",") if d)
            if dtype in _FLOATS and len(dims) > 1 and dims[0] == depth:
                found.append((dtype, dims, layout or ""))
    return found


def layer_loops(module: hlo.Module, depth: int) -> list[str]:
    """Names of the while loops of ``module`` that run once per layer of a ``depth``-layer model: ``depth``
    trips, and a stacked weight (an entry argument's shape, ``depth`` leading) in the loop's state. Other loops
    that happen to run ``depth`` times (a loss computed in that many chunks, say) carry no stacked weight."""
    stacked = {dims for _, dims, _ in _stacked_arguments(module, depth)}
    found = []
    for computation in module.computations.values():
        for instruction in computation.instructions:
            if instruction.opcode != "while" or hlo.trip_count(module, computation, instruction) != depth:
                continue
            if any(array.dtype in _FLOATS and array.dims in stacked for array in instruction.arrays):
                found.append(instruction.name)
    return found


def stacked_argument_bytes(module: hlo.Module, depth: int) -> float:
    """Bytes per chip (tile-padded) of the entry's float arguments stacked over ``depth`` layers, per layer."""
    return sum(hlo.DTYPE_BYTES[dtype] * math.prod(padded_dims(dims, layout))
               for dtype, dims, layout in _stacked_arguments(module, depth)) / depth


def stacked_temporary_bytes(module: hlo.Module, depth: int) -> float:
    """Bytes per chip (tile-padded) per layer of the stacks the layer loops carry that are not arguments: the
    activations saved for the backward pass (the forward loop's and the backward loop's copy) and the
    weights cast to the compute type. Arrays the compiler keeps on chip (memory space 1, VMEM) take no HBM."""
    arguments = {(dtype, dims) for dtype, dims, _ in _stacked_arguments(module, depth)}
    loops = set(layer_loops(module, depth))
    total = 0.0
    for computation in module.computations.values():
        for instruction in computation.instructions:
            if instruction.name not in loops:
                continue
            for dtype, dims_text, layout in hlo._ARRAY.findall(instruction.type_text):
                dims = tuple(int(d) for d in dims_text.split(",") if d)
                on_chip = hlo._MEMORY_SPACE.search(layout or "")
                if (dtype in _FLOATS and len(dims) > 1 and dims[0] == depth and (dtype, dims) not in arguments
                        and not (on_chip and on_chip.group(1) != "0")):
                    total += hlo.DTYPE_BYTES[dtype] * math.prod(padded_dims(dims, layout or ""))
    return total / depth


def difference(deeper, compiled):
    """``deeper - compiled`` leaf by leaf (numbers, nested dicts of numbers and lists of numbers); a key only one
    side has counts as zero on the other; None where either is None or the two do not match."""
    if isinstance(compiled, dict) and isinstance(deeper, dict):
        return {key: difference(deeper[key] if key in deeper else _zero(compiled[key]),
                                compiled[key] if key in compiled else _zero(deeper[key]))
                for key in set(compiled) | set(deeper)}
    if isinstance(compiled, (list, tuple)) and isinstance(deeper, (list, tuple)) and len(compiled) == len(deeper):
        return [difference(b, a) for a, b in zip(compiled, deeper)]
    if _number(compiled) and _number(deeper):
        return deeper - compiled
    return None


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _zero(like):
    if isinstance(like, dict):
        return {key: _zero(value) for key, value in like.items()}
    if isinstance(like, (list, tuple)):
        return [_zero(value) for value in like]
    return 0 if _number(like) else None


def combine(base, step, times: float):
    """``base + times * step`` leaf by leaf (the inverse of ``difference``); None where either is None."""
    if isinstance(base, dict) and isinstance(step, dict):
        return {key: combine(base[key] if key in base else _zero(step[key]),
                             step[key] if key in step else _zero(base[key]), times)
                for key in set(base) | set(step)}
    if isinstance(base, (list, tuple)) and isinstance(step, (list, tuple)) and len(base) == len(step):
        return [combine(a, b, times) for a, b in zip(base, step)]
    if _number(base) and _number(step):
        return base + times * step
    return None


def _reachable(module: hlo.Module, roots: list[str]) -> set[str]:
    """Computations ``roots`` run, directly or through the computations they call."""
    seen, stack = set(), list(roots)
    while stack:
        name = stack.pop()
        computation = module.computation(name)
        if name in seen or computation is None:
            continue
        seen.add(name)
        stack.extend(callee for instruction in computation.instructions for _, callee in instruction.called())
    return seen


def deeper_text(hlo_text: str, depth: int, extra: int = 1) -> str:
    """The compiled program as it would read with ``extra`` more layers, but for its loops' trip counts.

    Every stacked array (a float array shaped like a stacked entry argument:
    the weights, their gradients and optimizer state) gets ``depth + extra``
    as leading dimension, so the ops outside the layer loops that touch the
    whole stack (the optimizer's update, the gradient's norm) cost what they
    would; ops inside the loops read one layer of the stack, as before. The
    compiler's ``estimated_cycles`` of an op outside the layer loops grows
    with the bytes its result and operands grew by, above a fixed cost per op
    that does not (``fixed_cycles``).
    """
    module = hlo.parse(hlo_text)
    stacked = {dims for _, dims, _ in _stacked_arguments(module, depth)}
    loops = set(layer_loops(module, depth))
    floor = fixed_cycles(module)
    inside = _reachable(module, [callee for computation in module.computations.values()
                                 for instruction in computation.instructions if instruction.name in loops
                                 for _, callee in instruction.called()])

    def grow(match) -> str:
        dtype, dims_text, layout = match.groups()
        dims = tuple(int(d) for d in dims_text.split(",") if d)
        if dtype in _FLOATS and dims in stacked:
            dims = (depth + extra,) + dims[1:]
        return f"{dtype}[{','.join(map(str, dims))}]{layout or ''}"

    def padded_bytes(type_text: str) -> float:
        return sum(hlo.DTYPE_BYTES[dtype] * math.prod(padded_dims(tuple(int(d) for d in dims.split(",") if d),
                                                                   layout or ""))
                   for dtype, dims, layout in hlo._ARRAY.findall(type_text))

    def cycles_scale(computation: hlo.Computation, line: str) -> float:
        match = hlo._INSTRUCTION.match(line)
        instruction = computation.by_name.get(match.group(2)) if match else None
        if instruction is None:
            return 1.0
        types = [instruction.type_text] + [computation.by_name[name].type_text for name in instruction.operands
                                           if name in computation.by_name]
        before = sum(padded_bytes(text) for text in types)
        after = sum(padded_bytes(hlo._ARRAY.sub(grow, text)) for text in types)
        return after / before if before else 1.0

    lines, current = [], None
    for line in hlo_text.splitlines():
        if current is None:
            match = hlo._COMPUTATION.match(line)
            if match and "=" not in line.split("(")[0]:
                current = match.group(2)
        elif line.strip() == "}":
            current = None
        new = hlo._ARRAY.sub(grow, line)
        if current is not None and current not in inside and _CYCLES.search(new):
            scale = cycles_scale(module.computation(current), line)
            if scale != 1.0:
                new = _CYCLES.sub(lambda found: found.group(1) + str(round(_grown_cycles(int(found.group(2)), floor,
                                                                                          scale))), new, count=1)
        lines.append(new)
    return "\n".join(lines)


def fixed_cycles(module: hlo.Module) -> float:
    """The cycles libtpu charges an op whatever its size: the lower quartile of its fusions' estimates (the
    small fusions' fill and drain; 1,825 cycles in the sweep's v5e programs, where one update over a 3- and a
    6-layer stack is estimated at 4,175 and 6,534 cycles: 1,816 fixed, 786 per layer)."""
    cycles = sorted(int(found.group(2)) for computation in module.computations.values()
                    for instruction in computation.instructions if instruction.opcode == "fusion"
                    for found in [_CYCLES.search(instruction.attributes)] if found)
    return cycles[len(cycles) // 4] if cycles else 0.0


def _grown_cycles(cycles: int, floor: int, scale: float) -> float:
    """An op's cycles with its bytes ``scale`` times as many: the part above the fixed ``floor`` scales."""
    return cycles if cycles <= floor else floor + (cycles - floor) * scale


def per_layer(config, hlo_text: str, cost_at: Callable[[object, str], dict]) -> dict | None:
    """What one more layer adds to each ``LINEAR_FIELDS`` and ``MEMORY_FIELDS`` figure of a compiled step.

    ``cost_at(config, hlo_text)`` is the row's cost fields (``report.cost_fields``)
    of a compiled program for ``config``; it is called twice: for this program, and
    for ``config`` one layer deeper with the program's stacked arrays one layer
    longer (``deeper_text``) and its layer loops counted ``depth + 1`` times.
    Returns ``{"depth", "layer_loops", "fields"}``, or None where the program
    has no layer loop (see the module docstring).
    """
    depth = config.model.depth
    module = hlo.parse(hlo_text)
    loops = layer_loops(module, depth)
    if not loops:
        return None
    compiled = cost_at(config, hlo_text)
    deeper_config = dataclasses.replace(config, model=dataclasses.replace(config.model, depth=depth + 1))
    with hlo.trip_counts({name: depth + 1 for name in loops}):
        deeper = cost_at(deeper_config, deeper_text(hlo_text, depth))
    fields = {key: difference(deeper.get(key), compiled.get(key)) for key in LINEAR_FIELDS}
    arguments, temporaries = stacked_argument_bytes(module, depth), stacked_temporary_bytes(module, depth)
    fields.update(hbm_bytes_per_device=arguments + temporaries, compiler_peak_bytes=arguments + temporaries,
                  argument_bytes=arguments, temporary_bytes=temporaries)
    return {"depth": depth, "layer_loops": sorted(loops), "fields": fields}
