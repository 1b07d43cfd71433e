"""sweeps.hosts: which mode, share, TPU variables and jax.distributed settings a process gets.

The Cloud TPU VM case runs against a stub GCE metadata server on 127.0.0.1
(reached through GCE_METADATA_IP, as JAX and google-auth allow), describing
worker 2 of a v5litepod-16 (4 hosts of 4 chips). No TPU is involved.
"""

import json

import pytest

import helpers
from helpers import clean_env
from sweeps import hosts

V5E_16 = {  # what the metadata server of worker 2 of a v5litepod-16 answers
    "agent-worker-number": "2",
    "worker-network-endpoints": ",".join(f"t1v-n-1234-w-{i}:{i}:10.130.0.{10 + i}" for i in range(4)),
    "accelerator-type": "v5litepod-16",
}
ISOLATION = {"TPU_SKIP_MDS_QUERY": "1", "TPU_HOST_BOUNDS": "1,1,1", "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1",
             "TPU_PROCESS_BOUNDS": "1,1,1", "TPU_CHIPS_PER_PROCESS_BOUNDS": "2,2,1",
             "TPU_WORKER_HOSTNAMES": "localhost", "TPU_WORKER_ID": "0", "TPU_ACCELERATOR_TYPE": "v5litepod-4",
             "TPU_TOPOLOGY": "2x2", "TPU_TOPOLOGY_WRAP": "false,false,false", "TPU_TOPOLOGY_ALT": "false"}


@pytest.fixture
def metadata_server():
    """A stub of the GCE metadata server; yields (address, list of requested keys)."""
    requested = []

    def answer(path, headers):
        prefix = "/computeMetadata/v1/instance/attributes/"
        key = path[len(prefix):] if path.startswith(prefix) else None
        if headers.get("Metadata-Flavor") != "Google":
            return 403, b""
        requested.append(key)
        return (200, V5E_16[key].encode()) if key in V5E_16 else (404, b"")

    with helpers.serve_http(answer) as address:
        yield address, requested


def hosts_cli(*args, env):
    result = helpers.run_module("sweeps.launch", "hosts", *args, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_tpu_vm_worker_from_the_metadata_server(metadata_server):
    address, requested = metadata_server
    env = clean_env(GCE_METADATA_IP=address)
    plan = json.loads(hosts_cli("--json", env=env))
    assert plan["mode"] == "host-parallel" and plan["shard"] == [2, 4]
    assert plan["env"] == ISOLATION
    assert plan["distributed"] == {"initialize": False}
    assert plan["cluster"]["kind"] == "gce-tpu"
    assert {"agent-worker-number", "worker-network-endpoints", "accelerator-type"} <= set(requested)

    pod = json.loads(hosts_cli("--pod-wide", "--json", env=env))
    assert pod["mode"] == "pod-wide" and pod["shard"] == [0, 1] and pod["env"] == {}
    assert pod["distributed"] == {"initialize": True, "coordinator_address": "10.130.0.10:8482",
                                  "num_processes": 4, "process_id": 2}

    explicit = json.loads(hosts_cli("--shard", "1/3", "--json", env=env))  # --shard wins; isolation stays
    assert explicit["shard"] == [1, 3] and explicit["env"] == ISOLATION

    # Once confined (the variables applied), a host with chips is a one-host job to this module too.
    assert hosts.detect_cluster({**env, **ISOLATION}, chips_attached=True).kind == "local"
    assert hosts.detect_cluster(env, chips_attached=True).kind == "gce-tpu"

    text = hosts_cli(env=env)  # the readable form says the same
    assert "mode: host-parallel, share 2/4" in text and "env: TPU_SKIP_MDS_QUERY=1" in text


# What SkyPilot 0.14 adds to `run`'s environment on host 2 of a 4-host slice (sky/skylet/constants.py,
# sky/backends/task_codegen.py, cloud_vm_ray_backend.py's _skypilot_predefined_env_vars; TPU_NAME from
# its gcp-ray.yml.j2). The host is still a Cloud TPU VM, so the metadata server is there too.
SKYPILOT_HOST_2 = {
    "SKYPILOT_NODE_RANK": "2", "SKYPILOT_NUM_NODES": "4",
    "SKYPILOT_NODE_IPS": "\n".join(f"10.130.0.{10 + i}" for i in range(4)),
    "SKYPILOT_NUM_GPUS_PER_NODE": "0", "SKYPILOT_TASK_ID": "sky-managed-2026-01-01-00-00-00-000000_paper-0-of-1_1-0",
    "SKYPILOT_INTERNAL_JOB_ID": "1", "SKYPILOT_USER": "me", "TPU_NAME": "sky-1234-me",
    "SKYPILOT_CLUSTER_INFO": json.dumps({"cluster_name": "paper-0-of-1-1", "cloud": "GCP", "region": "us-west4",
                                         "zone": "us-west4-a"}),
}


def test_skypilot_tpu_host_decides_as_a_gcloud_one(metadata_server):
    address, _ = metadata_server
    gcloud, skypilot = clean_env(GCE_METADATA_IP=address), clean_env(GCE_METADATA_IP=address, **SKYPILOT_HOST_2)
    for flags in ([], ["--pod-wide"]):
        assert json.loads(hosts_cli("--json", *flags, env=skypilot)) == json.loads(hosts_cli("--json", *flags,
                                                                                             env=gcloud))
    # tpu/sweep.sky.yaml passes --shard (SHARD·H + rank)/(SHARES·H): for one job (0 of 1) that is the
    # metadata server's share, 2/4; for job 1 of 2 it is 6/8, with the same confinement to the host's chips.
    plan = json.loads(hosts_cli("--shard", "2/4", "--json", env=skypilot))
    assert plan == json.loads(hosts_cli("--json", env=gcloud))
    plan = json.loads(hosts_cli("--shard", "6/8", "--json", env=skypilot))
    assert (plan["mode"], plan["shard"], plan["env"]) == ("host-parallel", [6, 8], ISOLATION)


def test_hosts_command_never_starts_a_jax_backend(metadata_server):
    # The TPU variables only take effect if they are set before JAX starts its backend.
    address, _ = metadata_server
    code = ("from sweeps import launch; from jax._src import xla_bridge; "
            "assert launch.main(['hosts', '--pod-wide', '--json']) == 0; "
            "assert not xla_bridge._backends, xla_bridge._backends")
    result = helpers.run_python(code, env=clean_env(GCE_METADATA_IP=address), timeout=60)
    assert result.returncode == 0, result.stderr


def test_unreachable_metadata_server_is_one_error_line():
    env = clean_env(GCE_METADATA_IP="127.0.0.1:9")  # the discard port: nothing listens
    result = helpers.run_module("sweeps.launch", "hosts", "--json", env=env, timeout=60)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "metadata server" in result.stderr and "--shard" in result.stderr


def test_single_host_tpu_vm_is_single_but_pod_wide_still_initialises():
    one = hosts.Cluster("gce-tpu", 0, 1, ("10.0.0.2",), "v5litepod-8")
    assert hosts.decide({}, cluster=one).mode == "single"
    assert hosts.decide({}, cluster=one).env == {}
    pod = hosts.decide({}, pod_wide=True, cluster=one)
    assert pod.distributed == {"initialize": True, "coordinator_address": "10.0.0.2:8482",
                               "num_processes": 1, "process_id": 0}


def test_gke_slurm_explicit_and_local():
    gke = hosts.decide({"TPU_WORKER_HOSTNAMES": "h0,h1,h2,h3", "TPU_WORKER_ID": "3", "TPU_ACCELERATOR_TYPE": "v4-32"})
    assert (gke.mode, gke.shard, gke.cluster.kind) == ("host-parallel", (3, 4), "gke-tpu")
    assert (gke.env["TPU_ACCELERATOR_TYPE"], gke.env["TPU_TOPOLOGY"]) == ("v4-8", "2x2x1")
    assert gke.env["TPU_WORKER_HOSTNAMES"] == "localhost"
    # After the update the host looks like a one-host job, to this module and to JAX's own detection.
    assert hosts.decide({"TPU_WORKER_ID": "3", **gke.env}, cluster=None).mode == "single"
    assert hosts.decide({"TPU_WORKER_HOSTNAMES": "h0,h1", "TPU_WORKER_ID": "1"}, pod_wide=True).distributed[
        "coordinator_address"] == "h0:8482"

    slurm = {"SLURM_NTASKS": "16", "SLURM_PROCID": "11", "SLURM_LOCALID": "3", "SLURM_TASKS_PER_NODE": "8(x2)",
             "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
    plan = hosts.decide(slurm)
    assert (plan.mode, plan.shard, plan.env) == ("host-parallel", (11, 16), {"CUDA_VISIBLE_DEVICES": "3"})
    assert hosts.decide({**slurm, "CUDA_VISIBLE_DEVICES": "5"}).env == {}  # SLURM already gave one GPU
    assert hosts.decide(slurm, pod_wide=True).distributed == {"initialize": True, "auto": True,
                                                              "num_processes": 16, "process_id": 11}

    explicit = {"JAX_COORDINATOR_ADDRESS": "127.0.0.1:1234", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1"}
    assert hosts.decide(explicit, pod_wide=True).distributed == {
        "initialize": True, "coordinator_address": "127.0.0.1:1234", "num_processes": 2, "process_id": 1}

    local = hosts.decide({}, cluster=hosts.Cluster("local"))
    assert (local.mode, local.shard, local.env, local.distributed) == ("single", (0, 1), {}, {"initialize": False})
    assert hosts.decide({}, shard=(1, 2), cluster=hosts.Cluster("local")).mode == "host-parallel"


def test_bad_environments_give_one_line_errors():
    with pytest.raises(hosts.HostError, match="TPU_WORKER_ID.*--shard"):
        hosts.decide({"TPU_WORKER_HOSTNAMES": "h0,h1"})
    with pytest.raises(hosts.HostError, match="cannot take --shard"):
        hosts.decide({}, pod_wide=True, shard=(0, 2), cluster=hosts.Cluster("local"))
    with pytest.raises(hosts.HostError, match="name:id:ip"):
        hosts.parse_worker_endpoints("a:b")
    assert hosts.parse_worker_endpoints("w-0, w-1") == ("w-0", "w-1")


@pytest.mark.parametrize("slice_type,host_type", [("v5litepod-16", "v5litepod-4"), ("v4-32", "v4-8"),
                                                   ("v5p-64", "v5p-8"), ("v6e-16", "v6e-4"), ("v3-32", "v3-8")])
def test_one_host_accelerator_type(slice_type, host_type):
    assert hosts.one_host_accelerator_type(slice_type) == host_type


def test_check_starts_jax_as_run_would_and_reports_what_it_sees(metadata_server):
    address, _ = metadata_server
    local = helpers.run_module("sweeps.launch", "hosts", "--check", "--json", timeout=120,
                               env=clean_env(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=4"))
    assert local.returncode == 0, local.stderr
    facts = json.loads(local.stdout)["check"]
    assert facts == {"device_count": 4, "local_device_count": 4, "process_count": 1, "process_index": 0,
                     "platform": "cpu"}
    # One explicit process in pod-wide mode: jax.distributed really starts, and the check agrees.
    coordinator = f"127.0.0.1:{helpers.free_port()}"
    pod = helpers.run_module("sweeps.launch", "hosts", "--pod-wide", "--check", timeout=120,
                             env=clean_env(JAX_PLATFORMS="cpu", JAX_COORDINATOR_ADDRESS=coordinator,
                                           JAX_NUM_PROCESSES="1", JAX_PROCESS_ID="0"))
    assert pod.returncode == 0, pod.stderr
    assert "mode pod-wide, shard 0/1, process 0 of 1" in pod.stdout
    # A "TPU worker" whose JAX runs on the CPU: the check says so and fails, before any money is spent.
    tpu = helpers.run_module("sweeps.launch", "hosts", "--check", timeout=120,
                             env=clean_env(JAX_PLATFORMS="cpu", GCE_METADATA_IP=address))
    assert tpu.returncode == 1
    assert "mode host-parallel, shard 2/4, process 0 of 1" in tpu.stdout and "PROBLEM: JAX runs on cpu" in tpu.stdout


def test_gke_host_parallel_also_clears_the_unprefixed_topology_variables():
    slice_env = {"TPU_WORKER_HOSTNAMES": "h0,h1", "TPU_WORKER_ID": "1", "TPU_ACCELERATOR_TYPE": "v5litepod-8",
                 "TPU_PROCESS_ADDRESSES": "h0:8476,h1:8476", "HOST_BOUNDS": "1,2,1", "CHIPS_PER_HOST_BOUNDS": "2,2,1",
                 "WRAP": "false,false,false", "ALT": "false"}
    plan = hosts.decide(slice_env)
    assert (plan.mode, plan.shard) == ("host-parallel", (1, 2))
    assert set(plan.unset) == {"TPU_PROCESS_ADDRESSES", "HOST_BOUNDS", "CHIPS_PER_HOST_BOUNDS", "WRAP", "ALT"}
    environ = dict(slice_env)
    hosts.apply(plan, environ)
    assert not set(plan.unset) & set(environ) and environ["TPU_WORKER_HOSTNAMES"] == "localhost"
    assert hosts.decide(environ).mode == "single"  # a one-host job now, also to TPU_PROCESS_ADDRESSES readers
    assert "env: HOST_BOUNDS unset" in plan.describe() and plan.to_dict()["unset"] == list(plan.unset)
    assert hosts.decide(slice_env, pod_wide=True).unset == ()  # pod-wide keeps the slice's topology


def test_metadata_reads_are_retried_as_jax_retries_them(monkeypatch):
    answers = iter([503, 500, 200])
    requested = []

    def answer(path, headers):
        requested.append(path)
        code = next(answers, 503)
        return code, b"2" if code == 200 else b""

    monkeypatch.setattr(hosts, "METADATA_RETRY_SECONDS", 0.01)
    with helpers.serve_http(answer) as address:
        environ = {"GCE_METADATA_IP": address}
        assert hosts.read_metadata(environ, "agent-worker-number") == "2" and len(requested) == 3
        with pytest.raises(hosts.HostError, match="HTTP 503 .6 tries"):
            hosts.read_metadata(environ, "agent-worker-number")  # answers 503 from now on
        assert len(requested) == 3 + hosts.METADATA_TRIES
