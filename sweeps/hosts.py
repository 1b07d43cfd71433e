"""Where this process runs and what it should do there: one decision, made before JAX starts.

``decide(environ, pod_wide=..., shard=...)`` returns a ``HostPlan``:
- ``mode``: ``single`` (one machine, every run), ``host-parallel`` (each host
  of a multi-host job trains its own share of the sweep on its own devices,
  no cross-host communication) or ``pod-wide`` (every process trains every
  run together through ``jax.distributed``);
- ``shard``: (index, count) of this process's share, (0, 1) for all runs;
- ``env``: variables to set before JAX starts its backend, so that a host of
  a multi-host TPU slice sees itself as a one-host slice of its own 4 chips
  (host-parallel), or a SLURM task sees only its own GPUs;
- ``distributed``: whether and how to call ``jax.distributed.initialize``.

``python -m sweeps.launch hosts [--pod-wide] --json`` prints the decision
without starting JAX's backend; ``hosts --check`` then starts JAX as ``run``
would and reports what it sees (``check``).

The facts come from the environment where a scheduler puts them (GKE's
``TPU_WORKER_HOSTNAMES``/``TPU_WORKER_ID``, SLURM's ``SLURM_*``, or an explicit
``JAX_COORDINATOR_ADDRESS``/``JAX_NUM_PROCESSES``/``JAX_PROCESS_ID``), and on a
Cloud TPU VM from the GCE metadata server, the way JAX's own cluster detection
reads them. The server is asked only when TPU chips are attached or
``GCE_METADATA_IP`` is set, so a laptop never waits for it.

Host-parallel describes a one-host slice entirely in ``TPU_*`` variables (the
metadata server switched off, host and chip bounds of one 2x2 host, worker 0,
the one-host accelerator type and topology), the set GKE gives a container on a
one-host node: libtpu then sees no other host and JAX joins none. TPU names
that count TensorCores (v2, v3, v4, v5p) count two per chip: a host of a
``v4-32`` is a ``v4-8``. This has not run on hardware; README's TPU checklist
says what to check on the first slice. Pod-wide on a TPU VM always initialises
``jax.distributed``, even on one host (orbax's asynchronous checkpoints need it
with several processes), with the coordinator on worker 0 at JAX's port 8482.
Multislice jobs (``MEGASCALE_*``) are not handled.

Sources:
- JAX's cluster detection (metadata keys, ``TPU_SKIP_MDS_QUERY``, port 8482): jax/_src/clusters/cloud_tpu_cluster.py.
- The one-host variable set: GKE's TPU device plugin, pkg/tpu/util/util_test.go (``TestInitEnvs``).
- Process bounds of one process per host: jax/_src/test_multiprocess.py.
- The recipe: "How to test on a subset of TPUs in a TPU Pod", https://github.com/pytorch/xla/issues/7714.
"""

from __future__ import annotations

import dataclasses
import os
import re
import urllib.error
import urllib.request

from scaling import hardware, platforms
from scaling.hardware import TPU_CHIPS_PER_HOST

MODES = ("single", "host-parallel", "pod-wide")
TPU_COORDINATOR_PORT = 8482  # the port JAX's TPU cluster detection uses for worker 0
METADATA_TIMEOUT_SECONDS = 5.0
# JAX's get_metadata (jax/_src/clusters/cloud_tpu_cluster.py) asks up to 6 times, 0.5 s apart.
METADATA_TRIES, METADATA_RETRY_SECONDS = 6, 0.5
# GKE's TPU webhook and device plugin describe the whole multi-host slice with these too (besides the
# TPU_* ones replaced by tpu_single_host_env); libtpu would still see the slice through them.
GKE_MULTI_HOST_VARIABLES = ("TPU_PROCESS_ADDRESSES", "HOST_BOUNDS", "CHIPS_PER_HOST_BOUNDS", "WRAP", "ALT")
# Families whose accelerator-type suffix counts TensorCores (two per chip), not chips (scaling.hardware).
_CORE_COUNTED = tuple(family for family, grid in hardware.TPU_GRIDS.items() if grid.cores_per_chip == 2)


class HostError(ValueError):
    """The environment describes a cluster this process cannot place itself in; one line."""


@dataclasses.dataclass(frozen=True)
class Cluster:
    """What the environment says about the job: ``kind`` and this process's place in it.

    ``kind``: ``local`` (one process), ``gce-tpu`` (Cloud TPU VM, from the
    metadata server), ``gke-tpu``, ``slurm`` or ``explicit`` (JAX_* variables).
    ``hosts``: addresses of every host in worker order (TPU only).
    """

    kind: str
    index: int = 0
    count: int = 1
    hosts: tuple[str, ...] = ()
    accelerator_type: str | None = None


@dataclasses.dataclass(frozen=True)
class HostPlan:
    """This process's decision; see the module docstring. ``to_dict`` is the ``hosts --json`` output."""

    mode: str
    shard: tuple[int, int]
    env: dict
    distributed: dict
    cluster: Cluster
    unset: tuple[str, ...] = ()  # variables to remove before JAX starts (GKE's multi-host topology)

    def to_dict(self) -> dict:
        return {"mode": self.mode, "shard": list(self.shard), "env": dict(self.env), "unset": list(self.unset),
                "distributed": dict(self.distributed), "cluster": dataclasses.asdict(self.cluster)}

    def describe(self) -> str:
        """The decision as a few readable lines."""
        cluster, settings = self.cluster, self.distributed
        lines = [f"cluster: {cluster.kind}, process {cluster.index} of {cluster.count}"
                 + (f", accelerator {cluster.accelerator_type}" if cluster.accelerator_type else ""),
                 f"mode: {self.mode}, share {self.shard[0]}/{self.shard[1]}"]
        lines += [f"env: {key}={value}" for key, value in sorted(self.env.items())]
        lines += [f"env: {key} unset" for key in self.unset]
        if not settings.get("initialize"):
            lines.append("jax.distributed: not initialised (one process)")
        elif settings.get("auto"):
            lines.append(f"jax.distributed: initialised by JAX's own cluster detection, process "
                         f"{settings['process_id']} of {settings['num_processes']}")
        else:
            lines.append(f"jax.distributed: coordinator {settings['coordinator_address']}, process "
                         f"{settings['process_id']} of {settings['num_processes']}")
        return "\n".join(lines)


# ---------------------------------------------------------------------------
# Reading the environment


def metadata_url(environ, key: str) -> str:
    """URL of ``instance/attributes/KEY`` on the GCE metadata server (``GCE_METADATA_IP`` overrides the host)."""
    host = environ.get("GCE_METADATA_IP") or "metadata.google.internal"
    return f"http://{host}/computeMetadata/v1/instance/attributes/{key}"


def read_metadata(environ, key: str, timeout: float = METADATA_TIMEOUT_SECONDS,
                  tries: int = METADATA_TRIES) -> str | None:
    """The metadata attribute ``key`` as text, or None when the server has no such attribute (HTTP 404).

    Like JAX's ``get_metadata``, a failed read is tried again, up to ``tries`` times
    ``METADATA_RETRY_SECONDS`` apart: any answer but 200 and 404 (JAX retries 404 too, but it is
    the server's final word that an attribute is absent), and here also a refused or timed-out
    connection (the server restarting).
    """
    import time

    request = urllib.request.Request(metadata_url(environ, key), headers={"Metadata-Flavor": "Google"})
    for attempt in range(tries):
        last = attempt == tries - 1
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.read().decode().strip()
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return None
            if last:
                raise HostError(f"GCE metadata server: {key} answered HTTP {error.code} ({tries} tries)") from None
        except (urllib.error.URLError, OSError) as error:
            if last:
                raise HostError(f"cannot reach the GCE metadata server for {key} ({error}; {tries} tries); pass "
                                "--shard I/N, or unset GCE_METADATA_IP if this is not a TPU VM") from None
        time.sleep(METADATA_RETRY_SECONDS)
    return None


def parse_worker_endpoints(text: str) -> tuple[str, ...]:
    """Host addresses from ``worker-network-endpoints``: plain hostnames or ``name:id:ip`` triples."""
    hosts = []
    for entry in (e.strip() for e in text.split(",") if e.strip()):
        parts = entry.split(":")
        if len(parts) == 1:
            hosts.append(parts[0])
        elif len(parts) == 3:
            hosts.append(parts[2])
        else:
            raise HostError(f"worker-network-endpoints entry {entry!r}: expected a hostname or name:id:ip")
    return tuple(hosts)


def _int(environ, name: str) -> int:
    try:
        return int(environ[name])
    except (KeyError, ValueError):
        raise HostError(f"{name}={environ.get(name)!r}: expected an integer; pass --shard I/N") from None


def _tasks_per_node(environ) -> int:
    text = environ.get("SLURM_NTASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE") or "1"
    match = re.match(r"\d+", text)  # SLURM_TASKS_PER_NODE looks like "8(x2)"
    return int(match.group()) if match else 1


def detect_cluster(environ, *, chips_attached=None) -> Cluster:
    """This process's cluster, from the environment and (on TPU VMs) the metadata server.

    Order: GKE TPU variables, an explicit JAX_* job, SLURM, then the
    metadata server when ``GCE_METADATA_IP`` is set or TPU chips are attached
    (unless chips are attached and ``TPU_SKIP_MDS_QUERY`` is set).
    """
    gke_hosts = environ.get("TPU_PROCESS_ADDRESSES") or environ.get("TPU_WORKER_HOSTNAMES") or ""
    hosts = tuple(h.strip() for h in gke_hosts.split(",") if h.strip())
    if len(hosts) > 1:
        return Cluster("gke-tpu", _int(environ, "TPU_WORKER_ID"), len(hosts), hosts,
                       environ.get("TPU_ACCELERATOR_TYPE"))
    if environ.get("JAX_COORDINATOR_ADDRESS"):
        count = _int(environ, "JAX_NUM_PROCESSES")
        return Cluster("explicit", _int(environ, "JAX_PROCESS_ID"), count, (environ["JAX_COORDINATOR_ADDRESS"],))
    if int(environ.get("SLURM_NTASKS") or 1) > 1:
        return Cluster("slurm", _int(environ, "SLURM_PROCID"), _int(environ, "SLURM_NTASKS"))
    attached = platforms.tpu_chips() > 0 if chips_attached is None else chips_attached
    # Like JAX's GceTpuCluster: on a machine with chips, TPU_SKIP_MDS_QUERY means the topology is in the
    # environment (GKE, or a host already confined to itself). Without chips it says nothing: JAX's
    # cloud_tpu_init sets it itself on import there.
    confined = attached and environ.get("TPU_SKIP_MDS_QUERY") is not None
    if (environ.get("GCE_METADATA_IP") or attached) and not confined:
        number = read_metadata(environ, "agent-worker-number")
        endpoints = read_metadata(environ, "worker-network-endpoints")
        if number is not None and endpoints:
            hosts = parse_worker_endpoints(endpoints)
            index = int(number)
            if not 0 <= index < len(hosts):
                raise HostError(f"agent-worker-number {index} is not one of the {len(hosts)} worker endpoints")
            return Cluster("gce-tpu", index, len(hosts), hosts, read_metadata(environ, "accelerator-type"))
    return Cluster("local")


# ---------------------------------------------------------------------------
# Deciding


def one_host_accelerator_type(accelerator_type: str | None) -> str | None:
    """The accelerator type of one 4-chip host of a slice: v5litepod-16 -> v5litepod-4, v4-32 -> v4-8."""
    if not accelerator_type or "-" not in accelerator_type:
        return None
    family = accelerator_type.rsplit("-", 1)[0]
    per_chip = 2 if family in _CORE_COUNTED else 1
    return f"{family}-{TPU_CHIPS_PER_HOST * per_chip}"


def tpu_single_host_env(cluster: Cluster) -> dict[str, str]:
    """Variables that make this host of a multi-host slice a one-host slice of its own chips (see docstring)."""
    env = {"TPU_SKIP_MDS_QUERY": "1", "TPU_HOST_BOUNDS": "1,1,1", "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1",
           "TPU_PROCESS_BOUNDS": "1,1,1", "TPU_CHIPS_PER_PROCESS_BOUNDS": "2,2,1",
           "TPU_WORKER_HOSTNAMES": "localhost", "TPU_WORKER_ID": "0"}
    one_host = one_host_accelerator_type(cluster.accelerator_type)
    if one_host:
        grid = hardware.tpu_grid(one_host.rsplit("-", 1)[0])
        three_d = grid is not None and grid.dims == 3
        env.update(TPU_ACCELERATOR_TYPE=one_host, TPU_TOPOLOGY="2x2x1" if three_d else "2x2",
                   TPU_TOPOLOGY_WRAP="false,false,false", TPU_TOPOLOGY_ALT="false")
    return env


def slurm_gpu_env(environ) -> dict[str, str]:
    """With several SLURM tasks per node, this task's slice of the node's ``CUDA_VISIBLE_DEVICES``."""
    gpus = [g for g in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    per_node = _tasks_per_node(environ)
    if per_node > 1 and gpus and len(gpus) % per_node == 0:
        share = len(gpus) // per_node
        local = int(environ.get("SLURM_LOCALID", "0"))
        return {"CUDA_VISIBLE_DEVICES": ",".join(gpus[local * share:(local + 1) * share])}
    return {}


def _distributed(cluster: Cluster) -> dict:
    if cluster.kind in ("gce-tpu", "gke-tpu"):
        coordinator = cluster.hosts[0].split(":")[0]
        return {"initialize": True, "coordinator_address": f"{coordinator}:{TPU_COORDINATOR_PORT}",
                "num_processes": cluster.count, "process_id": cluster.index}
    if cluster.kind == "explicit":
        return {"initialize": True, "coordinator_address": cluster.hosts[0], "num_processes": cluster.count,
                "process_id": cluster.index}
    if cluster.kind == "slurm":  # JAX's SlurmCluster reads the node list and picks the coordinator
        return {"initialize": True, "auto": True, "num_processes": cluster.count, "process_id": cluster.index}
    return {"initialize": False}


def decide(environ, *, pod_wide: bool = False, shard: tuple[int, int] | None = None,
           cluster: Cluster | None = None) -> HostPlan:
    """This process's ``HostPlan`` (see the module docstring); ``shard`` is an explicit ``--shard I/N``.

    Raises ``HostError`` (one line) when the environment cannot be read, and
    when ``pod_wide`` is combined with ``shard``.
    """
    if pod_wide and shard is not None:
        raise HostError("--pod-wide trains every run on all hosts together; it cannot take --shard")
    cluster = detect_cluster(environ) if cluster is None else cluster
    if pod_wide:
        return HostPlan("pod-wide", (0, 1), {}, _distributed(cluster), cluster)
    env, unset = {}, ()
    if cluster.kind in ("gce-tpu", "gke-tpu") and cluster.count > 1:
        env = tpu_single_host_env(cluster)
        if cluster.kind == "gke-tpu":
            unset = tuple(name for name in GKE_MULTI_HOST_VARIABLES if name in environ)
    elif cluster.kind == "slurm":
        env = slurm_gpu_env(environ)
    if shard is None and cluster.count > 1:
        shard = (cluster.index, cluster.count)
    if shard is None or shard[1] == 1:
        return HostPlan("single", (0, 1), env, {"initialize": False}, cluster, unset)
    return HostPlan("host-parallel", tuple(shard), env, {"initialize": False}, cluster, unset)


def apply(plan: HostPlan, environ=None) -> None:
    """Put ``plan.env`` into the process environment and remove ``plan.unset``; must run before JAX
    starts its backend."""
    environ = os.environ if environ is None else environ
    environ.update(plan.env)
    for name in plan.unset:
        environ.pop(name, None)


def initialize(plan: HostPlan) -> None:
    """Start ``jax.distributed`` as ``plan.distributed`` says (nothing when it says not to)."""
    settings = plan.distributed
    if not settings.get("initialize"):
        return
    from scaling.model import mesh as mesh_lib

    if settings.get("auto"):
        mesh_lib.initialize_distributed(auto=True)
    else:
        mesh_lib.initialize_distributed(settings["coordinator_address"], settings["num_processes"],
                                        settings["process_id"])


def check(plan: HostPlan) -> tuple[dict, list[str]]:
    """Start JAX as ``run`` would under ``plan``; what it sees, and what contradicts the plan.

    The facts are ``device_count``, ``local_device_count``, ``process_count``,
    ``process_index`` and ``platform``. Host-parallel and single-machine
    processes must be alone (``process_count`` 1) and see only local devices;
    pod-wide ones must be ``num_processes`` processes.
    """
    apply(plan)
    initialize(plan)
    import jax

    facts = {"device_count": jax.device_count(), "local_device_count": jax.local_device_count(),
             "process_count": jax.process_count(), "process_index": jax.process_index(),
             "platform": jax.devices()[0].platform}
    expected = plan.distributed.get("num_processes", 1) if plan.mode == "pod-wide" else 1
    problems = []
    if facts["process_count"] != expected:
        problems.append(f"process_count is {facts['process_count']}, expected {expected}")
    if plan.mode != "pod-wide" and facts["device_count"] != facts["local_device_count"]:
        problems.append(f"sees {facts['device_count']} devices but only {facts['local_device_count']} are local: "
                        "the host is not confined to its own chips")
    if plan.cluster.kind in ("gce-tpu", "gke-tpu") and facts["platform"] != "tpu":
        problems.append(f"JAX runs on {facts['platform']}, not tpu (is libtpu installed? JAX_PLATFORMS set?)")
    return facts, problems
