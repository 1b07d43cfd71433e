"""Packed runs (scaling/model/packed.py): k runs of one shape as one vmapped program, each member a solo run.

Every check runs in both batchings (``vmap``, ``map``) where the runs share devices.

Tolerance. A member's losses equal its solo run's to a relative 2e-6 (measured: at most 2 float32
ulps, ~1e-7, over 5 steps), not bitwise: XLA:CPU compiles the packed step (vmapped: batched
dot_generals; mapped: the solo step in a loop) into other fusions than the solo step, so its sums
run in another order; the few-ulp differences in the gradient then carry through Adam (vmap: the
states after 5 steps differ by ~3e-7 relative; map: equal in one measurement, which the tests do not rely on). The initial states are
bitwise equal (the same random bits), and packing and unpacking states moves bits, so those
checks are exact.
"""

import dataclasses
import re

import jax
import numpy as np
import pytest

import tiny
from scaling.config import MeshConfig
from scaling.data import pipeline as data
from scaling.model import mesh as mesh_lib, packed, program
from scaling.run.train import resolve_config
from scaling.store.checkpoints import Checkpoints

STEPS = 5
RTOL = 2e-6  # see the module docstring
PIPELINE = data.build(tiny.config().data)


def configs(*runs: tuple[int, float]):
    """tiny.config() with each (seed, peak learning rate) of ``runs``, its vocabulary resolved."""
    base = tiny.config()
    return [resolve_config(dataclasses.replace(base, seed=seed, optim=dataclasses.replace(base.optim, peak_lr=lr)),
                           PIPELINE) for seed, lr in runs]


def arguments(config):
    return data.program_arguments(config.data, config.model.objective, config.model.vocab_size)


THREE = configs((0, 3e-3), (1, 1e-3), (2, 1e-2))


def train_solo(config, mesh, steps=STEPS, state=None, start=0):
    """(losses, state) of ``config`` trained alone with ``program.build``'s train step on ``mesh``."""
    solo = program.build(config, mesh, **arguments(config))
    state = solo.init(jax.random.PRNGKey(config.seed)) if state is None else state
    hparams = jax.device_put(program.hyperparameters(config), mesh_lib.replicated(mesh))
    losses = []
    for step in range(start, start + steps):
        batch = mesh_lib.global_batch(PIPELINE.train_batch(config.seed, step, config.batch_size), mesh,
                                      config.batch_size)
        state, metrics = solo.train_step(state, batch, hparams)
        losses.append(float(metrics["loss"]))
    return losses, state


def train_packed(pack, configs_, steps=STEPS, state=None, start=0):
    """(per-step member metrics, state) of ``configs_`` trained as the pack ``pack``."""
    state = pack.init(packed.stack_keys([c.seed for c in configs_])) if state is None else state
    hparams = packed.stack_hyperparameters([program.hyperparameters(c) for c in configs_])
    rows = []
    for step in range(start, start + steps):
        batches = [PIPELINE.train_batch(c.seed, step, c.batch_size) for c in configs_]
        state, metrics = pack.train_step(state, packed.global_batch(batches, pack, configs_[0].batch_size), hparams)
        rows.append(packed.member_metrics(metrics))
    return rows, state


def one_device_pack(configs_, batching):
    mesh = mesh_lib.make_packed_mesh(MeshConfig(), runs=1, devices=tiny.one_device())
    pack = packed.build_packed(packed.pack_shape(configs_, **arguments(configs_[0])), mesh, len(configs_), batching)
    assert pack.batching == batching
    return pack


@pytest.fixture(scope="module")
def solo_runs():
    """Each of THREE trained alone on one device: [(losses, state)]."""
    mesh = mesh_lib.make_mesh(MeshConfig(), tiny.one_device())
    return [train_solo(config, mesh) for config in THREE]


@pytest.fixture(scope="module", params=packed.BATCHINGS)
def pack_of_three(request):
    """THREE trained as one pack on one device, in each batching: (pack, per-step metrics, state)."""
    pack = one_device_pack(THREE, request.param)
    rows, state = train_packed(pack, THREE)
    return pack, rows, state


def test_a_packed_run_trains_as_it_does_alone(solo_runs, pack_of_three):
    pack, rows, _ = pack_of_three
    for member, (losses, _) in enumerate(solo_runs):
        packed_losses = [row[member]["loss"] for row in rows]
        np.testing.assert_allclose(packed_losses, losses, rtol=RTOL, err_msg=f"member {member}")
        assert all(row[member]["finite"] for row in rows)
    # The members trained differently (seeds and rates reached the right members).
    assert len({row[member]["loss"] for row in rows[-1:] for member in range(3)}) == 3


def test_the_initial_state_is_the_solo_runs_bit_for_bit():
    pack = one_device_pack(THREE, "vmap")
    state = pack.init(packed.stack_keys([c.seed for c in THREE]))
    for member, config in enumerate(THREE):
        solo = pack.solo.init(jax.random.PRNGKey(config.seed))
        jax.tree_util.tree_map(np.testing.assert_array_equal, packed.member_state(pack, state, member), solo)


@pytest.mark.parametrize("batching", packed.BATCHINGS)
def test_a_diverging_member_keeps_its_state_while_the_others_train_on(solo_runs, batching):
    runs = [THREE[0], configs((1, 1e30))[0], THREE[2]]  # member 1's second step (the first at a rate > 0) blows up
    pack = one_device_pack(runs, batching)
    state = pack.init(packed.stack_keys([c.seed for c in runs]))
    hparams = packed.stack_hyperparameters([program.hyperparameters(c) for c in runs])
    finite, before = [], None
    for step in range(STEPS):
        before = packed.member_state(pack, state, 1)  # a copy: the step donates the packed state
        batches = [PIPELINE.train_batch(c.seed, step, c.batch_size) for c in runs]
        state, metrics = pack.train_step(state, packed.global_batch(batches, pack, 8), hparams)
        rows = packed.member_metrics(metrics)
        finite.append(rows[1]["finite"])
        if not rows[1]["finite"]:
            break
    assert finite[0] and not finite[-1], finite  # it diverged, at a step after the first
    after = packed.member_state(pack, state, 1)
    # The failed step was not applied to member 1: its parameters and optimizer state are the last good ones.
    jax.tree_util.tree_map(np.testing.assert_array_equal, after["params"], before["params"])
    jax.tree_util.tree_map(np.testing.assert_array_equal, after["opt_state"], before["opt_state"])
    # The others go on exactly as alone, through and after member 1's failure.
    rows, _ = train_packed(pack, runs, steps=STEPS - len(finite), state=state, start=len(finite))
    for member in (0, 2):
        np.testing.assert_allclose([row[member]["loss"] for row in rows], solo_runs[member][0][len(finite):],
                                   rtol=RTOL)


def test_a_members_slice_is_a_solo_state_that_restores_alone_and_packs_anywhere(solo_runs, pack_of_three,
                                                                                tmp_path):
    pack, _, state = pack_of_three
    members = [packed.member_state(pack, state, member) for member in range(3)]
    solo_abstract = pack.solo.abstract_state  # the solo program's, on the same device
    structure = lambda tree: jax.tree_util.tree_map(lambda x: (x.shape, x.dtype, x.sharding), tree)  # noqa: E731
    for member, (_, solo_state) in enumerate(solo_runs):
        assert structure(members[member]) == structure(solo_abstract)
        assert structure(packed.member_abstract_state(pack, member)) == structure(solo_abstract)
        jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
                               members[member], solo_state)
        assert int(members[member]["step"]) == STEPS
    # Unpacking then packing moves bits only.
    jax.tree_util.tree_map(np.testing.assert_array_equal, packed.stack_states(pack, members), state)

    # Member 1's checkpoint (the trainer's orbax checkpoints) restores into a solo run's abstract state.
    checkpoints = Checkpoints(tmp_path / "checkpoints", 1, solo_abstract)
    checkpoints.save(STEPS, members[1], {"wandb_id": "none"})
    checkpoints.finish()
    restored, _, step = checkpoints.restore_newest()
    checkpoints.close()
    assert step == STEPS
    jax.tree_util.tree_map(np.testing.assert_array_equal, restored, members[1])

    # Packed in another order (the restored member first), every run goes on as it does alone.
    order = [1, 2, 0]
    runs = [THREE[i] for i in order]
    rows, _ = train_packed(pack, runs, steps=1, state=packed.stack_states(pack, [restored, members[2], members[0]]),
                           start=STEPS)
    mesh = mesh_lib.make_mesh(MeshConfig(), tiny.one_device())
    for position, member in enumerate(order):
        alone, _ = train_solo(THREE[member], mesh, steps=1, state=jax.tree_util.tree_map(np.copy, members[member]),
                              start=STEPS)
        np.testing.assert_allclose(rows[0][position]["loss"], alone[0], rtol=RTOL)


def test_configs_of_different_shapes_are_refused():
    wider = configs((0, 3e-3))[0]
    wider = dataclasses.replace(wider, model=dataclasses.replace(wider.model, width=32))
    with pytest.raises(ValueError, match=r"configs\[1\].*differ in model"):
        packed.pack_shape([THREE[0], wider], **arguments(wider))
    with pytest.raises(ValueError, match="runs=3 is invalid"):
        mesh_lib.make_packed_mesh(MeshConfig(), runs=3, devices=jax.devices()[:8])
    shape = packed.pack_shape(THREE, **arguments(THREE[0]))
    four_groups = mesh_lib.make_packed_mesh(MeshConfig(), runs=4, devices=jax.devices()[:8])
    with pytest.raises(ValueError, match="size=6 is invalid"):
        packed.build_packed(shape, four_groups, 6)
    with pytest.raises(ValueError, match="batching='map' is invalid"):
        packed.build_packed(shape, four_groups, 4, "map")


def test_a_cpu_pack_loops_over_its_runs_unless_they_have_devices_of_their_own():
    one_group = mesh_lib.make_packed_mesh(MeshConfig(), runs=1, devices=jax.devices()[:8])
    assert packed.default_batching(one_group) == "map"  # see scaling/model/packed.py and benchmarks/packed_throughput.py
    assert packed.default_batching(mesh_lib.make_packed_mesh(MeshConfig(), runs=4, devices=jax.devices()[:8])) == "vmap"


# ---------------------------------------------------------------------------
# 8 fake CPU devices: 4 groups of 2, one run per group (runs=4, data=2)


def replica_groups(hlo_text: str) -> list[list[list[int]]]:
    """The device groups of every collective in compiled HLO text: explicit ``{{0,1},{2,3}}``, iota
    ``[4,2]<=[8]`` (optionally ``T(perm)``), mesh ``mesh['a'=4,'b'=2] {'b'}``, or collective-permute pairs."""
    found = []
    for line in hlo_text.splitlines():
        if not re.search(r"= \S+ (all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)"
                         r"(-start)?\(", line):
            continue
        if match := re.search(r"(?:replica_groups|source_target_pairs)=\{(\{[\d,]*\}(?:,\{[\d,]*\})*)\}", line):
            found.append([[int(x) for x in group.split(",") if x] for group in re.findall(r"\{([\d,]*)\}",
                                                                                           match.group(1))])
        elif match := re.search(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", line):
            shape, dims = [int(x) for x in match.group(1).split(",")], [int(x) for x in match.group(2).split(",")]
            ids = np.arange(np.prod(dims)).reshape(dims)
            if match.group(3):
                ids = ids.transpose([int(x) for x in match.group(3).split(",")])
            found.append(ids.reshape(shape).tolist())
        elif match := re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", line):
            axes = re.findall(r"'([^']+)'=(\d+)", match.group(1))
            names, sizes = [a for a, _ in axes], [int(n) for _, n in axes]
            reduced = [names.index(a) for a in re.findall(r"'([^']+)'", match.group(2))]
            ids = np.moveaxis(np.arange(np.prod(sizes)).reshape(sizes), reduced, list(range(-len(reduced), 0)))
            found.append(ids.reshape(-1, int(np.prod([sizes[i] for i in reduced]))).tolist())
        else:
            raise AssertionError(f"a collective whose groups this test cannot read: {line.strip()[:300]}")
    return found


def test_the_replica_group_reader():
    text = ("%a = f32[2] all-reduce(%x), replica_groups={{0,1},{2,3}}, to_apply=%add\n"
            "%b = f32[2] all-gather(%x), replica_groups=[2,4]<=[4,2]T(1,0), dimensions={0}\n"
            "%c = f32[1] all-reduce(%x), replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_0'}, to_apply=%add\n"
            "%d = f32[1] collective-permute(%x), source_target_pairs={{0,1},{1,0}}\n")
    assert replica_groups(text) == [[[0, 1], [2, 3]], [[0, 2, 4, 6], [1, 3, 5, 7]], [[0, 2, 4, 6], [1, 3, 5, 7]],
                                    [[0, 1], [1, 0]]]


def test_a_pack_sharded_over_runs_trains_each_run_on_its_own_devices(eight_devices):
    runs = configs((0, 3e-3), (1, 1e-3), (2, 1e-2), (3, 2e-3))
    mesh = mesh_lib.make_packed_mesh(MeshConfig(), runs=4, devices=eight_devices)
    assert dict(mesh.shape) == {"runs": 4, "data": 2, "fsdp": 1, "tensor": 1}
    pack = packed.build_packed(packed.pack_shape(runs, **arguments(runs[0])), mesh, 4)
    for sharding in jax.tree_util.tree_leaves(pack.state_shardings):
        assert sharding.spec[0] == "runs"

    rows, state = train_packed(pack, runs)
    group_mesh = mesh_lib.group_mesh(mesh, 0)  # a solo run on 2 devices, data-parallel like each group
    for member, config in enumerate(runs):
        losses, solo_state = train_solo(config, group_mesh)
        np.testing.assert_allclose([row[member]["loss"] for row in rows], losses, rtol=RTOL)
        mine = packed.member_state(pack, state, member)
        devices = {d.id for d in eight_devices[2 * member:2 * member + 2]}
        assert all({d.id for d in leaf.sharding.device_set} == devices for leaf in jax.tree_util.tree_leaves(mine))
        jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), mine, solo_state)

    # The compiled step's collectives (the data-parallel gradient sums) stay inside a group of 2 devices.
    hparams = packed.stack_hyperparameters([program.hyperparameters(c) for c in runs])
    batch = packed.global_batch([PIPELINE.train_batch(c.seed, 0, 8) for c in runs], pack, 8)
    text = pack.train_step.lower(pack.abstract_state, batch, hparams).compile().as_text()
    groups = replica_groups(text)
    assert groups, "expected the data axis's gradient all-reduce"
    # The ids are positions in the program's device order, the mesh's (runs major): group = id // 2.
    for collective in groups:
        for group in collective:
            assert len({i // 2 for i in group}) == 1, f"a collective across runs: {collective}"
