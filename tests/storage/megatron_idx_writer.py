#!/usr/bin/env python3
"""Writes what Megatron's tools/preprocess_data.py writes for a JSONL file, independently of troupe.

Written from the format description (docs/DATA.md, MMIDIDX) and Megatron's semantics
(tools/preprocess_data.py Encoder.encode, megatron/core/datasets/indexed_dataset.py
IndexedDatasetBuilder.add_document and _IndexWriter.write), with the byte-level tokenizer
(ids 0..255 are the UTF-8 bytes, EOD 256, vocabulary 257, so dtype uint16):
  - each document is one sentence (no --split-sentences); a sentence of no tokens is dropped;
  - with --append-eod the EOD id ends a document that has tokens;
  - add_document writes the tokens, extends the sequence lengths by the sentences' lengths and
    appends the sequence count to doc_idx, so an empty document repeats the entry before it.

usage: megatron_idx_writer.py INPUT.jsonl KEY (eod|noeod) OUT_PREFIX
"""
import json
import struct
import sys

import numpy as np


def main():
    path, key, eod, out = sys.argv[1], sys.argv[2], sys.argv[3] == "eod", sys.argv[4]
    sequence_lengths, document_indices, data = [], [0], bytearray()
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue  # troupe skips blank lines (Megatron's json.loads would fail on them)
            text = json.loads(line)[key]
            doc_ids, sentence_lens = [], []
            for sentence in [text]:
                ids = list(sentence.encode("utf-8"))
                if len(ids) > 0:
                    doc_ids.extend(ids)
                    sentence_lens.append(len(ids))
            if len(doc_ids) > 0 and eod:
                doc_ids.append(256)
                sentence_lens[-1] += 1
            data += np.array(doc_ids, dtype=np.uint16).tobytes(order="C")
            sequence_lengths.extend(sentence_lens)
            document_indices.append(len(sequence_lengths))
    pointers, p = [], 0
    for n in sequence_lengths:
        pointers.append(p)
        p += n * 2
    with open(out + ".bin", "wb") as f:
        f.write(bytes(data))
    with open(out + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", 8))  # uint16
        f.write(struct.pack("<Q", len(sequence_lengths)))
        f.write(struct.pack("<Q", len(document_indices)))
        f.write(np.array(sequence_lengths, dtype=np.int32).tobytes(order="C"))
        f.write(np.array(pointers, dtype=np.int64).tobytes(order="C"))
        f.write(np.array(document_indices, dtype=np.int64).tobytes(order="C"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
