#!/usr/bin/env python3
"""Writes a FLUX.2 transformer as one FP8 safetensors file in BFL's layout at a published model's
shapes (klein-4b, klein-9b, dev), with random values: every block projection F8_E4M3 (no NaN codes)
with a per-tensor F32 weight_scale and input_scale, the rest bf16, and BFL's
_quantization_metadata header (model/fp8_checkpoint.h, bfl_fp8). For timing the load of a real-size
FP8 file (`flux2 bench --transformer-file`, run_on_device.sh `fp8-load`); the values are a repeated
random block, so only the size matters. Python stdlib only; streams tensor by tensor.
  python3 tests/gpu/make_fp8_file.py --model dev --out /tmp/dev_fp8.safetensors"""
import argparse
import json
import math
import os
import struct

SHAPES = {  # (hidden D, double blocks, single blocks, text width J, guidance embedder)
    "klein-4b": (3072, 5, 20, 7680, False),
    "klein-9b": (4096, 8, 24, 12288, False),
    "dev": (6144, 8, 48, 15360, True),
}
C, T, DH = 128, 256, 128  # latent channels, timestep channels, head width


def layers(model):
    """(name, shape, fp8) of every tensor of the BFL single file."""
    d, doubles, singles, j, guidance = SHAPES[model]
    f = 3 * d
    out = [("img_in.weight", [d, C], False), ("txt_in.weight", [d, j], False),
           ("time_in.in_layer.weight", [d, T], False), ("time_in.out_layer.weight", [d, d], False),
           ("double_stream_modulation_img.lin.weight", [6 * d, d], False),
           ("double_stream_modulation_txt.lin.weight", [6 * d, d], False),
           ("single_stream_modulation.lin.weight", [3 * d, d], False),
           ("final_layer.linear.weight", [C, d], False),
           ("final_layer.adaLN_modulation.1.weight", [2 * d, d], False)]
    if guidance:
        out += [("guidance_in.in_layer.weight", [d, T], False),
                ("guidance_in.out_layer.weight", [d, d], False)]
    for b in range(doubles):
        for s in ("img", "txt"):
            p = f"double_blocks.{b}.{s}"
            out += [(p + "_attn.qkv.weight", [3 * d, d], True), (p + "_attn.proj.weight", [d, d], True),
                    (p + "_mlp.0.weight", [2 * f, d], True), (p + "_mlp.2.weight", [d, f], True),
                    (p + "_attn.norm.query_norm.scale", [DH], False),
                    (p + "_attn.norm.key_norm.scale", [DH], False)]
    for b in range(singles):
        p = f"single_blocks.{b}"
        out += [(p + ".linear1.weight", [3 * d + 2 * f, d], True), (p + ".linear2.weight", [d, d + f], True),
                (p + ".norm.query_norm.scale", [DH], False), (p + ".norm.key_norm.scale", [DH], False)]
    return out


def tensors(model):
    """(name, dtype, shape, nbytes) in file order, scales beside their weights."""
    out = []
    for name, shape, fp8 in layers(model):
        n = math.prod(shape)
        out.append((name, "F8_E4M3" if fp8 else "BF16", shape, n * (1 if fp8 else 2)))
        if fp8:
            layer = name[: -len(".weight")]
            out += [(layer + ".weight_scale", "F32", [], 4), (layer + ".input_scale", "F32", [], 4)]
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=sorted(SHAPES), required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    entries, header, offset = tensors(args.model), {}, 0
    for name, dtype, shape, nbytes in entries:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    quantized = {n[: -len(".weight")]: {"format": "float8_e4m3fn"} for n, _, q in layers(args.model) if q}
    header["__metadata__"] = {"_quantization_metadata":
                              json.dumps({"format_version": "1.0", "layers": quantized})}
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    block = 1 << 26
    # E4M3 codes without the NaN codes 0x7F / 0xFF; bf16 values of magnitude 2^-7..2^-5 with a random
    # sign (high bytes 0x3C, 0x3D and their negatives; never NaN or Inf).
    fp8 = os.urandom(block).translate(bytes(b - 1 if b & 0x7F == 0x7F else b for b in range(256)))
    bf16 = bytearray(block)
    bf16[0::2] = os.urandom(block // 2)
    bf16[1::2] = os.urandom(block // 2).translate(bytes((0x3C, 0x3D, 0xBC, 0xBD)[b & 3] for b in range(256)))
    with open(args.out, "wb") as out:
        out.write(struct.pack("<Q", len(blob)) + blob)
        for name, dtype, shape, nbytes in entries:
            if dtype == "F32":
                out.write(struct.pack("<f", 0.01 if name.endswith("weight_scale") else 0.05))
                continue
            source = fp8 if dtype == "F8_E4M3" else bf16
            left = nbytes
            while left > 0:
                take = min(left, len(source))
                out.write(source[:take])
                left -= take
    print(f"{args.out}: {args.model}, {len(entries)} tensors, {(offset + 8 + len(blob)) / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
