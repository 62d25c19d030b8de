#!/usr/bin/env python3
"""Checks a dataset against Megatron's MMIDIDX format independently of troupe's C++ reader.

Written from the format description (docs/DATA.md), reading the way Megatron's MMapIndexedDataset
does: the header with struct, then np.frombuffer over a np.memmap of .idx at the computed offsets,
then each sequence from a memmap of .bin at its pointer.

usage: megatron_format_check.py PREFIX EXPECTED.json
EXPECTED.json: {"dtype": "uint16", "documents": [[id, ...], ...]}  (one token list per document)
Exit status 0 when the dataset holds exactly those documents, 1 (with a message) otherwise.
"""
import json
import struct
import sys

import numpy as np

DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
          8: np.uint16}


def read_dataset(prefix):
    with open(prefix + ".idx", "rb") as f:
        magic = f.read(9)
        assert magic == b"MMIDIDX\x00\x00", f"bad magic {magic!r}"
        (version,) = struct.unpack("<Q", f.read(8))
        assert version == 1, f"version {version}"
        (code,) = struct.unpack("<B", f.read(1))
        dtype = DTYPES[code]
        (n,) = struct.unpack("<Q", f.read(8))
        (d,) = struct.unpack("<Q", f.read(8))
        offset = f.tell()
    assert offset == 34
    idx = np.memmap(prefix + ".idx", mode="r", order="C")
    assert len(idx) == offset + 4 * n + 8 * n + 8 * d, "idx length does not match its counts"
    sizes = np.frombuffer(idx, dtype=np.int32, count=n, offset=offset)
    pointers = np.frombuffer(idx, dtype=np.int64, count=n, offset=offset + sizes.nbytes)
    doc_idx = np.frombuffer(idx, dtype=np.int64, count=d, offset=offset + sizes.nbytes + pointers.nbytes)
    binf = np.memmap(prefix + ".bin", mode="r", order="C")
    itemsize = np.dtype(dtype).itemsize
    assert len(binf) == int(sizes.astype(np.int64).sum()) * itemsize, ".bin length does not match sizes"
    docs = []
    for i in range(d - 1):
        tokens = []
        for s in range(int(doc_idx[i]), int(doc_idx[i + 1])):
            seq = np.frombuffer(binf, dtype=dtype, count=int(sizes[s]), offset=int(pointers[s]))
            tokens.extend(int(t) for t in seq)
        docs.append(tokens)
    return np.dtype(dtype).name, docs


def main():
    prefix, expected_path = sys.argv[1], sys.argv[2]
    with open(expected_path) as f:
        expected = json.load(f)
    dtype, docs = read_dataset(prefix)
    if dtype != expected["dtype"]:
        print(f"{prefix}: dtype {dtype}, expected {expected['dtype']}")
        return 1
    if len(docs) != len(expected["documents"]):
        print(f"{prefix}: {len(docs)} documents, expected {len(expected['documents'])}")
        return 1
    for i, (got, want) in enumerate(zip(docs, expected["documents"])):
        if got != want:
            print(f"{prefix}: document {i} differs: got {got[:20]}..., expected {want[:20]}...")
            return 1
    print(f"{prefix}: {len(docs)} documents match ({dtype})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
