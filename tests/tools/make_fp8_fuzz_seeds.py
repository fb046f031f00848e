#!/usr/bin/env python3
"""Writes the seeds of tests/fuzz/fuzz_fp8_checkpoint.cc into tests/fuzz/corpus/fp8_checkpoint: the
tiny transformer of that target (hidden 8 = 1 head x 8, one double and one single block, joint 8,
in/out 8, timestep channels 16, no guidance) as one small BFL-named file per single-file FP8
layout of model/fp8_checkpoint.h (bfl_fp8 with one per-row [N, 1] scale, comfy_fp8 under
model.diffusion_model. keeping the double block bf16, comfy_scaled_fp8). Python stdlib only; tests/host/fp8_checkpoint_test.cc keeps the seeds opening.
  python3 tests/tools/make_fp8_fuzz_seeds.py"""
import json
import os
import struct

D, F, J, C, T, DH = 8, 24, 8, 8, 16, 8
OUT = os.path.join(os.path.dirname(__file__), "..", "fuzz", "corpus", "fp8_checkpoint")


def bf16(n, seed):  # bf16 values 2^-k-ish, deterministic
    return b"".join(struct.pack("<H", 0x3C00 + ((seed * 7 + i * 13) % 64)) for i in range(n))


def fp8(n, seed):  # E4M3 codes, no NaN (0x7F / 0xFF)
    return bytes(((seed * 11 + i * 29) % 0x7E) | (0x80 if i % 3 == 0 else 0) for i in range(n))


def f32(values):
    return b"".join(struct.pack("<f", v) for v in values)


def write(path, tensors, metadata=None):
    header, data = {}, b""
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata:
        header["__metadata__"] = metadata
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(blob)) + blob + data)


def bfl_layers():
    """(name, shape, quantizable) of every BFL tensor of the tiny config."""
    top = [("img_in.weight", [D, C]), ("txt_in.weight", [D, J]), ("time_in.in_layer.weight", [D, T]),
           ("time_in.out_layer.weight", [D, D]), ("double_stream_modulation_img.lin.weight", [6 * D, D]),
           ("double_stream_modulation_txt.lin.weight", [6 * D, D]),
           ("single_stream_modulation.lin.weight", [3 * D, D]), ("final_layer.linear.weight", [C, D]),
           ("final_layer.adaLN_modulation.1.weight", [2 * D, D])]
    layers = [(n, s, False) for n, s in top]
    for s in ("img", "txt"):
        p = "double_blocks.0." + s
        layers += [(p + "_attn.qkv.weight", [3 * D, D], True), (p + "_attn.proj.weight", [D, D], True),
                   (p + "_mlp.0.weight", [2 * F, D], True), (p + "_mlp.2.weight", [D, F], True),
                   (p + "_attn.norm.query_norm.scale", [DH], False),
                   (p + "_attn.norm.key_norm.scale", [DH], False)]
    layers += [("single_blocks.0.linear1.weight", [3 * D + 2 * F, D], True),
               ("single_blocks.0.linear2.weight", [D, D + F], True),
               ("single_blocks.0.norm.query_norm.scale", [DH], False),
               ("single_blocks.0.norm.key_norm.scale", [DH], False)]
    return layers


def bfl_file(prefix, quantize, scale_names, extra=None):
    tensors = {}
    for k, (name, shape, q) in enumerate(bfl_layers()):
        n = shape[0] * (shape[1] if len(shape) > 1 else 1)
        if q and quantize(name):
            layer = name[: -len(".weight")]
            tensors[prefix + name] = ("F8_E4M3", shape, fp8(n, k))
            tensors[prefix + layer + scale_names[0]] = ("F32", [], f32([0.01 + k / 1000]))
            tensors[prefix + layer + scale_names[1]] = ("F32", [], f32([0.5]))
            if extra:
                extra(tensors, prefix + layer)
        else:
            tensors[prefix + name] = ("BF16", shape, bf16(n, k))
    return tensors


def main():
    os.makedirs(OUT, exist_ok=True)
    modern = (".weight_scale", ".input_scale")
    t = bfl_file("", lambda n: True, modern)
    t["double_blocks.0.img_attn.qkv.weight_scale"] = ("F32", [3 * D, 1], f32([0.01 * (r + 1) for r in range(3 * D)]))
    layers = {n[: -len(".weight")]: {"format": "float8_e4m3fn"} for n, _, q in bfl_layers() if q}
    write(os.path.join(OUT, "bfl_fp8.safetensors"), t,
          {"_quantization_metadata": json.dumps({"format_version": "1.0", "layers": layers})})

    quant = json.dumps({"format": "float8_e4m3fn"}).encode()
    t = bfl_file("model.diffusion_model.", lambda n: n.startswith("single"), modern,
                 lambda ts, layer: ts.__setitem__(layer + ".comfy_quant", ("U8", [len(quant)], quant)))
    write(os.path.join(OUT, "comfy_fp8mixed.safetensors"), t)

    t = bfl_file("", lambda n: True, (".scale_weight", ".scale_input"))
    t["scaled_fp8"] = ("F8_E4M3", [0], b"")
    write(os.path.join(OUT, "comfy_scaled_fp8.safetensors"), t)


if __name__ == "__main__":
    main()
