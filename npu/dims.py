"""Reading `--dynamic_dims` gears: which input each gear value belongs to.

GE concatenates a gear over the inputs ATC's `--input_shape` lists, in that order (the model's
user_designate_shape_order: ge_executor.cc GetCurDynamicDims, model_om2.cpp
aclmdlGetInputDynamicDims), not over every input in model order. The binding does not report
that order (each gear's "name" is empty), so it is read from the gears themselves: the orders of
the inputs whose ranks fill a gear and whose static dims match it at every gear. When several
such orders give the inputs different shapes, the config must say which one ATC used, in the
parameter `input_shape` (ATC's own `--input_shape` text, or just its names).
"""

from __future__ import annotations

from collections.abc import Sequence

from backends.base import BackendError

ORDER_PARAMETER = "input_shape"
_MAX_ORDERS = 720  # orders tried (6 inputs of the same dims) before asking for the parameter

Dims = tuple[int, ...]


def _ranks(inputs: Sequence[tuple[str, Dims]]) -> str:
    return ", ".join(f"{name} {list(dims)}" for name, dims in inputs)


def parse_order(text: str, inputs: Sequence[tuple[str, Dims]]) -> list[int]:
    """Positions (into `inputs`) named by the parameter: ATC's --input_shape text
    ("tokens:1,-1;mask:1,-1") or its names alone ("tokens;mask" or "tokens,mask")."""
    parts = [p.strip() for p in text.split(";") if p.strip()]
    if len(parts) == 1 and ":" not in parts[0]:
        parts = [p.strip() for p in parts[0].split(",") if p.strip()]
    names = [name for name, _ in inputs]
    order: list[int] = []
    for part in parts:
        name, _, shape = part.rpartition(":") if ":" in part else (part, "", "")
        name = name.strip()
        if name not in names:
            raise BackendError(
                f"parameter {ORDER_PARAMETER} names '{name[:80]}', which is not an input of the "
                f"model (inputs: {', '.join(names)})"
            )
        position = names.index(name)
        if position in order:
            raise BackendError(f"parameter {ORDER_PARAMETER} lists input '{name}' twice")
        if shape:
            try:
                given = tuple(int(d) for d in shape.split(","))
            except ValueError:
                raise BackendError(
                    f"parameter {ORDER_PARAMETER}: '{part[:80]}' is not name:dims"
                ) from None
            if given != inputs[position][1]:
                raise BackendError(
                    f"parameter {ORDER_PARAMETER} gives input '{name}' dims {list(given)}, "
                    f"the model has {list(inputs[position][1])}"
                )
        order.append(position)
    if not order:
        raise BackendError(f"parameter {ORDER_PARAMETER} lists no inputs")
    return order


def _matches(dims: Dims, gear: Sequence[int], at: int) -> bool:
    return all(d == -1 or gear[at + k] == d for k, d in enumerate(dims))


def _orders(inputs: Sequence[tuple[str, Dims]], gears: Sequence[Sequence[int]]) -> list[list[int]]:
    """Every order of inputs that explains the gears: ranks summing to the gear length, static
    dims matching, every input with a -1 included."""
    length = len(gears[0])
    needed = {i for i, (_, dims) in enumerate(inputs) if -1 in dims}
    found: list[list[int]] = []

    def walk(at: int, order: list[int]) -> None:
        if len(found) >= _MAX_ORDERS:
            return
        if at == length:
            if needed <= set(order):
                found.append(list(order))
            return
        for i, (_, dims) in enumerate(inputs):
            if i in order or not dims or at + len(dims) > length:
                continue  # rank-0 inputs add nothing to a gear: leaving them out is the same
            if all(_matches(dims, gear, at) for gear in gears):
                order.append(i)
                walk(at + len(dims), order)
                order.pop()

    walk(0, [])
    return found


def _check(order: list[int], inputs: Sequence[tuple[str, Dims]], gears) -> None:
    """The order the config gave against the gears, with the numbers of the first mismatch."""
    listed = [inputs[i] for i in order]
    total = sum(len(dims) for _, dims in listed)
    if total != len(gears[0]):
        raise BackendError(
            f"parameter {ORDER_PARAMETER} lists {_ranks(listed)}: {total} dims, but each of the "
            f"model's --dynamic_dims gears has {len(gears[0])} (first gear {list(gears[0])})"
        )
    missing = [name for i, (name, dims) in enumerate(inputs) if -1 in dims and i not in order]
    if missing:
        raise BackendError(
            f"input(s) {', '.join(missing)} have dynamic dims but parameter {ORDER_PARAMETER} "
            "does not list them"
        )
    for number, gear in enumerate(gears):
        at = 0
        for name, dims in listed:
            for axis, d in enumerate(dims):
                if d != -1 and gear[at + axis] != d:
                    raise BackendError(
                        f"gear {number} {list(gear)} gives input '{name}' {gear[at + axis]} on "
                        f"axis {axis} (position {at + axis}), the model has {d} there: parameter "
                        f"{ORDER_PARAMETER} is not the order ATC's --input_shape used"
                    )
            at += len(dims)


def split(
    inputs: Sequence[tuple[str, Dims]], gears: Sequence[Sequence[int]], text: str | None
) -> list[tuple[Dims, ...]]:
    """Each gear as every input's dims in model order (an input --input_shape does not list
    keeps its own static dims). Refuses, with the numbers, gears that no order explains, an
    order given in the config that does not fit them, and gears read two different ways."""
    gears = [tuple(int(d) for d in g) for g in gears]
    if not gears:
        return []
    if len({len(g) for g in gears}) != 1:
        raise BackendError(
            f"the model's --dynamic_dims gears differ in length: {[list(g) for g in gears]}"
        )
    if text:
        order = parse_order(text, inputs)
        _check(order, inputs, gears)
    else:
        orders = _orders(inputs, gears)
        if not orders:
            raise BackendError(
                f"the model's --dynamic_dims gears have {len(gears[0])} dims each (first gear "
                f"{list(gears[0])}), which no order of its inputs ({_ranks(inputs)}) explains: "
                "each gear must hold the dims of the inputs ATC's --input_shape lists, in its "
                f"order; set parameter {ORDER_PARAMETER} to that --input_shape"
            )
        readings = {tuple(_shapes(o, inputs, g) for g in gears): o for o in orders}
        if len(orders) >= _MAX_ORDERS:
            raise BackendError(
                f"the model's --dynamic_dims gears (first {list(gears[0])}) fit {_MAX_ORDERS} "
                f"or more orders of its inputs ({_ranks(inputs)}): set parameter "
                f"{ORDER_PARAMETER} to ATC's --input_shape"
            )
        if len(readings) > 1:
            named = [";".join(inputs[i][0] for i in o) for o in list(readings.values())[:3]]
            shown = " or ".join(named)
            raise BackendError(
                f"the model's --dynamic_dims gears (first {list(gears[0])}) fit more than one "
                f"order of its inputs ({shown}), which give them different shapes: set "
                f'parameter {ORDER_PARAMETER} to ATC\'s --input_shape (e.g. "{named[0]}")'
            )
        order = next(iter(readings.values()))
    return [_shapes(order, inputs, gear) for gear in gears]


def _shapes(order: list[int], inputs: Sequence[tuple[str, Dims]], gear: Sequence[int]):
    shapes = [dims for _, dims in inputs]
    at = 0
    for i in order:
        rank = len(inputs[i][1])
        shapes[i] = tuple(int(d) for d in gear[at : at + rank])
        at += rank
    return tuple(shapes)
