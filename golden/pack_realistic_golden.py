#!/usr/bin/env python
"""Pack the outputs of an upstream "realistic" bundle (from golden/make_golden.py) into compact test data.

The inputs are not stored: each case keeps its ``CaseSpec`` and the sha256 digest of its inputs, so a test
regenerates them with ``mimo_numerics.cases.make_inputs`` and proves, by the digest, that they are the very inputs the
upstream kernel saw. That keeps the realistic set under 10 MB.

    python golden/pack_realistic_golden.py BUNDLE_DIR tests/data/upstream_h200_realistic_outputs.pt
"""

import sys

import torch

from mimo_numerics.bundles import inputs_digest, load_bundle
from mimo_numerics.cases import tensor_digests
from mimo_numerics.ops.mamba_mimo_bwd_fwd.cases import make_inputs


def main(bundle_dir: str, out: str) -> int:
    bundle = load_bundle(bundle_dir, verify=True)
    packed = {"provenance": dict(bundle.meta), "created": bundle.created, "cases": {}}
    for case in bundle.cases:
        if case.outputs is None:
            continue
        digest = inputs_digest(case.inputs)
        if inputs_digest(make_inputs(case.spec)) != digest:
            raise SystemExit(f"{case.name}: make_inputs(spec) does not regenerate the bundle's inputs")
        packed["cases"][case.name] = {"spec": case.spec.to_dict(), "inputs_sha256": digest,
                                      "tensor_sha256": tensor_digests(case.inputs),
                                      "device_name": case.device_name, "versions": dict(case.versions or {}),
                                      "upstream": case.outputs.as_dict() if hasattr(case.outputs, "as_dict")
                                      else dict(case.outputs)}
    torch.save(packed, out)
    print(f"wrote {out}: {len(packed['cases'])} case(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
