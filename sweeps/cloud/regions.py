"""Where a sweep's jobs may run: the accelerator must be offered in the region, and the region must be the bucket's.

- ``offered_regions``: the GCP regions SkyPilot's downloaded catalog
  (``~/.sky/catalogs/<schema>/gcp/vms.csv``, the file ``sweeps.preflight.prices``
  reads prices from) lists an accelerator in. Not every TPU generation is in
  every region (v4 is in us-central2 alone; v6e and v5p are not in us-west4),
  and a job pinned to a region without its accelerator would queue forever.
  Without a downloaded catalog nothing is checked, and ``check_offered`` says so.
- ``check_infra_region``: an explicit ``--infra gcp/REGION`` against the bucket's
  location: restarts read checkpoints and the token cache from the bucket,
  which across regions is slower and billed as egress.
"""

from __future__ import annotations

import csv
import io

# A multi-region bucket's location -> the prefix of the regions inside it (Cloud Storage's bucket locations).
MULTI_REGIONS = {"US": "us-", "EU": "europe-", "ASIA": "asia-"}


def offered_regions(accelerator_name: str, catalog: str) -> set[str]:
    """The regions the SkyPilot catalog file ``catalog`` lists ``accelerator_name`` in (``tpu-v5litepod-8``,
    ``H100``; its ``AcceleratorName`` column)."""
    with open(catalog, encoding="utf-8") as handle:
        rows = csv.DictReader(io.StringIO(handle.read()))
        return {row["Region"] for row in rows if (row.get("AcceleratorName") or "").strip() == accelerator_name
                and row.get("Region")}


def check_offered(accelerator_name: str, infra: str, home: str | None = None) -> str:
    """One line saying whether ``infra``'s region (``gcp/<region>[/<zone>]``) offers ``accelerator_name``;
    ``ValueError`` (one line) when SkyPilot's catalog lists it elsewhere only."""
    from sweeps.preflight import prices  # the one reader of SkyPilot's catalog files

    region = (infra.split("/") + ["", ""])[1]
    catalog = prices.find_skypilot_catalog(home)
    if not region or catalog is None:
        return (f"note: not checked whether {region or 'the region'} offers {accelerator_name}: no SkyPilot catalog "
                "downloaded (`sky show-gpus --infra gcp` downloads it)")
    offered = offered_regions(accelerator_name, catalog)
    if not offered:
        raise ValueError(f"--accelerator {accelerator_name}: not in SkyPilot's catalog {catalog} in any region")
    if region not in offered:
        raise ValueError(f"--accelerator {accelerator_name}: not offered in {region} (the bucket's region, or "
                         f"--infra) by SkyPilot's catalog {catalog}; it is in {', '.join(sorted(offered))}: use a "
                         "bucket there, or another accelerator")
    return f"{accelerator_name} is offered in {region} (SkyPilot's catalog {catalog})"


def check_infra_region(region: str, location: str, location_type: str, workdir: str) -> None:
    """``ValueError`` (one line) when the region named by ``--infra`` is not the bucket's: outside its
    multi-region, or another region than a regional bucket's. Dual-regions are not checked."""
    region, location = region.lower(), location.upper()
    if location_type == "region" and region != location.lower():
        raise ValueError(f"--infra gcp/{region}: {workdir}'s bucket is in {location.lower()}; the jobs must run "
                         f"beside it (checkpoints, token cache): --infra gcp/{location.lower()}, or omit --infra")
    prefix = MULTI_REGIONS.get(location) if location_type == "multi-region" else None
    if prefix and not region.startswith(prefix):
        raise ValueError(f"--infra gcp/{region}: {workdir}'s bucket is in the multi-region {location}; name a "
                         f"region in it ({prefix}...)")
