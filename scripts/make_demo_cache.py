"""Build a demo kernel cache in CANN's format under the folder given (used by scripts/demo).

Good entries are published through cachemgr's store; damaged ones are written by hand the
way an interrupted or buggy CANN process leaves them.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from cachemgr.ini import OpCacheIni
from cachemgr.store import Store


def kernel_json(name: str, binary: bytes) -> dict[str, object]:
    return {
        "binFileName": name,
        "binFileSuffix": ".o",
        "kernelName": name + "__kernel0",
        "sha256": hashlib.sha256(binary).hexdigest(),
        "blockDim": 8,
        "coreType": "AIV",
        "magic": "RT_DEV_BINARY_MAGIC_ELF_AIVEC",
    }


def main(root: Path) -> None:
    kc = root / "kernel_cache"
    chip = kc / "Ascend910B1"
    store = Store(chip)
    for op in ("Add", "Mul", "Softmax"):
        name = f"te_{op}_{hashlib.sha256(op.encode()).hexdigest()}"
        binary = os.urandom(4096)
        store.publish(name, {name + ".o": binary}, kernel_json(name, binary))
    mix = "te_MatMulAdd_" + hashlib.sha256(b"mm").hexdigest()
    files, json_list = {}, []
    for part in ("aic", "aiv"):
        sub, binary = f"{mix}_mix_{part}", os.urandom(2048)
        files[sub + ".o"] = binary
        files[sub + ".json"] = json.dumps(kernel_json(sub, binary)).encode()
        json_list.append({"binType": part.upper(), "jsonFileName": sub + ".json"})
    store.publish(mix, files, {"coreType": "MixAICore", "blockDim": 32, "jsonList": json_list})
    bad = "te_Mul_" + "d" * 64  # a binary overwritten after its json was written
    (chip / f"{bad}.o").write_bytes(b"not what the json says")
    (chip / f"{bad}.json").write_text(json.dumps(kernel_json(bad, b"original")))
    (chip / ("te_Cast_" + "e" * 64 + ".o")).write_bytes(b"a binary whose json never came")
    (chip / ("te_Relu_" + "f" * 64 + ".json")).write_text('{"binFileName": "te_Relu_')
    OpCacheIni.create(kc / "op_cache.ini", 500, 50, "7.0.0", "7.0.0")
    print(f"demo kernel cache written to {kc}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
