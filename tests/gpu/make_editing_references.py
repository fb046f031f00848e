#!/usr/bin/env python3
"""Reference data for editing that tests/data lacks, made on the GPU machine (PyTorch, PIL).

1. diffusers' own bf16 error on the VAE encoder (the `e_ref` of tests/data/README.md's bf16 bar) for
   tiny-klein's vae_encode cases: AutoencoderKLFlux2 from tests/data/tiny-klein/checkpoint/vae in
   bf16 on CUDA, fed each case's golden `image` as Flux2KleinPipeline._encode_vae_image does
   (encode, latent_dist.mode(), patchify 2x2, BatchNorm normalisation, all in bf16), compared with
   the float32 goldens by relative L2 error. Written to $OUT/bf16_reference_vae_encode.json, which
   is committed as tests/data/tiny-klein/bf16_reference_vae_encode.json.
2. How close our reference resize (stb_image_resize, Catmull-Rom) comes to PIL's Lanczos, which
   diffusers uses for references over 1024x1024 px: synthetic images prepared by
   flux2_prepare_reference and by diffusers' steps in PIL (_resize_to_target_area, then the
   center crop to multiples of 16), pixel statistics printed as JSON lines.

usage: make_editing_references.py --diffusers DIR (diffusers' src/) --tool flux2_prepare_reference
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    dtypes = {"F32": np.float32, "I64": np.int64}
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        begin, end = meta["data_offsets"]
        out[name] = np.frombuffer(data[begin:end], dtype=dtypes[meta["dtype"]]).reshape(meta["shape"])
    return out


def relative_error(ours, ref):
    ours = np.asarray(ours, dtype=np.float64).ravel()
    ref = np.asarray(ref, dtype=np.float64).ravel()
    return float(np.linalg.norm(ours - ref) / np.linalg.norm(ref))


def vae_encode_errors(diffusers_src, golden_dir):
    import torch

    sys.path.insert(0, diffusers_src)
    from diffusers import AutoencoderKLFlux2  # noqa: E402  (the carried source)

    vae = AutoencoderKLFlux2.from_pretrained(os.path.join(golden_dir, "checkpoint", "vae"),
                                             torch_dtype=torch.bfloat16).to("cuda").eval()
    vectors = read_safetensors(os.path.join(golden_dir, "vae_encode.safetensors"))
    errors = {}
    k = 0
    while f"case{k}.image" in vectors:
        image = torch.from_numpy(vectors[f"case{k}.image"].copy()).to("cuda", torch.bfloat16)
        with torch.no_grad():
            mean = vae.encode(image).latent_dist.mode()  # argmax: the posterior's mean
            b, c, h, w = mean.shape
            patched = mean.view(b, c, h // 2, 2, w // 2, 2).permute(0, 1, 3, 5, 2, 4)
            patched = patched.reshape(b, c * 4, h // 2, w // 2)
            bn_mean = vae.bn.running_mean.view(1, -1, 1, 1).to(patched.dtype)
            bn_std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) +
                                vae.config.batch_norm_eps).to(patched.dtype)
            latents = (patched - bn_mean) / bn_std
        errors[f"vae_encode.case{k}.latent_mean"] = relative_error(
            mean.float().cpu().numpy(), vectors[f"case{k}.latent_mean"])
        errors[f"vae_encode.case{k}.image_latents"] = relative_error(
            latents.float().cpu().numpy(), vectors[f"case{k}.image_latents"])
        k += 1
    return errors


def synthetic_images(rng):
    """Photo-like content: smooth gradients, texture, sharp edges and fine periodic detail."""
    images = []
    for width, height in [(1600, 1200), (2048, 2048), (3000, 1000), (1280, 1280)]:
        y, x = np.mgrid[0:height, 0:width].astype(np.float64)
        base = np.stack([128 + 100 * np.sin(x / 97.0 + c) * np.cos(y / 131.0 - c)
                         for c in range(3)], axis=-1)
        texture = rng.normal(0, 12, size=(height, width, 3))
        edges = 60.0 * (((x // 37) + (y // 53)) % 2)[..., None]
        fine = 25.0 * np.sin(x / 2.3)[..., None] * (y < height / 3)[..., None]
        images.append(np.clip(base + texture + edges + fine, 0, 255).astype(np.uint8))
    return images


def pil_prepare(pil_image):
    """diffusers: _resize_to_target_area (LANCZOS) when over 1024^2 px, then _resize_and_crop."""
    import math

    from PIL import Image

    w, h = pil_image.size
    if w * h > 1024 * 1024:
        scale = math.sqrt(1024 * 1024 / (w * h))
        pil_image = pil_image.resize((int(w * scale), int(h * scale)), Image.Resampling.LANCZOS)
    w, h = pil_image.size
    cw, ch = w // 16 * 16, h // 16 * 16
    left, top = (w - cw) // 2, (h - ch) // 2
    return np.asarray(pil_image.crop((left, top, left + cw, top + ch)))


def resize_comparison(tool):
    from PIL import Image

    rows = []
    rng = np.random.default_rng(5)
    with tempfile.TemporaryDirectory() as tmp:
        for i, pixels in enumerate(synthetic_images(rng)):
            src, dst = os.path.join(tmp, f"in{i}.png"), os.path.join(tmp, f"out{i}.png")
            Image.fromarray(pixels).save(src)
            subprocess.run([tool, src, dst], check=True)
            ours = np.asarray(Image.open(dst).convert("RGB")).astype(np.int64)
            pil = pil_prepare(Image.open(src).convert("RGB")).astype(np.int64)
            if ours.shape != pil.shape:
                rows.append({"image": i, "error": f"shapes differ: {ours.shape} vs {pil.shape}"})
                continue
            diff = np.abs(ours - pil)
            mse = float(np.mean(diff.astype(np.float64) ** 2))
            rows.append({"image": i, "source": list(pixels.shape[1::-1]),
                         "prepared": list(ours.shape[1::-1]),
                         "mean_abs_levels": float(diff.mean()), "max_abs_levels": int(diff.max()),
                         "fraction_over_1_level": float(np.mean(diff > 1)),
                         "psnr_db": 10 * np.log10(255.0 ** 2 / mse) if mse > 0 else None})
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--diffusers", required=True)
    parser.add_argument("--tool", required=True)
    parser.add_argument("--golden", default="tests/data/tiny-klein")
    args = parser.parse_args()
    out_dir = os.environ.get("OUT", "/tmp")
    status = 0
    try:
        errors = vae_encode_errors(args.diffusers, args.golden)
        with open(os.path.join(out_dir, "bf16_reference_vae_encode.json"), "w") as f:
            json.dump({"what": "relative L2 error of diffusers' bf16 VAE encoder (H200) against the "
                               "float32 golden, per tensor; made by tests/gpu/"
                               "make_editing_references.py", "errors": errors}, f, indent=1)
        print(json.dumps(errors))
    except Exception as error:  # report and go on to the resize comparison
        print(f"vae_encode bf16 errors: FAILED: {error!r}")
        status = 1
    try:
        for row in resize_comparison(args.tool):
            print(json.dumps(row))
    except Exception as error:
        print(f"resize comparison: FAILED: {error!r}")
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
