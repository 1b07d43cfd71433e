"""The price table shipped with the project: used when no ``--prices`` file is given and SkyPilot has not
downloaded its own catalog (``sweeps.preflight.prices`` says the order).

Read by hand from SkyPilot's published GCP catalog, schema v8 (``catalogs/v8/gcp/vms.csv`` of
github.com/skypilot-org/skypilot-catalog, the snapshot at commit 006059e0f18a, which SkyPilot builds from
the Cloud Billing API, i.e. the prices of cloud.google.com/tpu/pricing and
cloud.google.com/compute/gpus-pricing), US regions only, on the date below. Per device-hour:
a TPU slice's price divided by its chips (v5litepod-8: $9.60 / 8 chips = $1.20 in most US regions, $11.328
/ 8 = $1.416 in us-south1; v4 and v5p name slices by TensorCores, two per chip), a GPU row's price divided by
its GPU count. Ranges run from the cheapest US region to the dearest. SkyPilot's placeholder for a v6e price it could not find ($700 a slice) is left
out. GPU prices are the GPUs alone: the VM that hosts them (a3-highgpu-1g: about $1.18 an hour on demand
in us-central1) is billed on top. Prices change: pass ``--prices FILE`` (same format) for current ones.
"""

SOURCE = ("the project's price table (sweeps/preflight/price_table.py), read from SkyPilot's published GCP catalog "
          "v8 (skypilot-org/skypilot-catalog@006059e0f18a, gcp/vms.csv), US regions")
READ_ON = "2026-11-25"

# The format of a --prices file: device, on-demand and spot US dollars per device-hour (a number or a
# LOW-HIGH range; spot may be empty). Lines starting with # are comments.
TABLE = """\
device,on_demand,spot
v4,3.22,0.9215
v5e,1.20-1.416,0.24493-0.60
v5p,4.20-4.779,0.8357-1.68
v6e,2.70,0.54421-1.35
H100,4.20076-11.03385,2.2356-2.9926
H200,4.57532-9.31174,3.6567-5.4939
A100,2.93391-3.43686,1.2406-1.5648
A100-80GB,1.8462-4.4242,1.3356-1.964
"""
