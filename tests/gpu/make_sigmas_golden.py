#!/usr/bin/env python3
# Makes tests/data/tiny-flux2-dev/sigmas_cases.json + sigmas.safetensors: diffusers' Flux2Pipeline
# (float32, CPU) on the tiny dev checkpoint with custom `sigmas=`, the oracle of `flux2 check-golden
# --only sigmas`. Run on the device (torch + transformers there) with diffusers' src/ unpacked:
#   python3 tests/gpu/make_sigmas_golden.py DIFFUSERS_SRC OUT_DIR   (tests/data/README.md)
import json
import sys

import torch

sys.path.insert(0, sys.argv[1])
from diffusers import Flux2Pipeline  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

CHECKPOINT = "tests/data/tiny-flux2-dev/checkpoint"
CASES = [
    # An 8-step few-step schedule of the kind distilled adapters ship (strictly decreasing, ends
    # near 0), text-to-image as pipeline_cases.json case0 otherwise.
    {"prompt": "a red fox in the snow, watercolor", "height": 64, "width": 64, "steps": 8,
     "seed": 107, "guidance_scale": 4.0, "max_sequence_length": 64,
     "sigmas": [1.0, 0.6509, 0.4374, 0.2932, 0.1893, 0.1108, 0.0495, 0.00031]},
    # A schedule that starts below 1 and is not a linspace, at another size.
    {"prompt": "a lighthouse at dusk", "height": 48, "width": 80, "steps": 3, "seed": 5,
     "guidance_scale": 2.5, "max_sequence_length": 64, "sigmas": [0.9, 0.5, 0.125]},
]


def run(pipe, case, k, out):
    h, w = case["height"] // 16, case["width"] // 16
    generator = torch.Generator("cpu").manual_seed(case["seed"])
    out[f"case{k}.initial_latents"] = torch.randn(
        (1, 128, h, w), generator=torch.Generator("cpu").manual_seed(case["seed"]))

    def on_step(pipeline, step, timestep, kwargs):
        out[f"case{k}.latents_after_step{step}"] = kwargs["latents"].detach().float().contiguous().clone()
        return kwargs

    image = pipe(prompt=case["prompt"], height=case["height"], width=case["width"],
                 num_inference_steps=case["steps"], sigmas=case["sigmas"],
                 guidance_scale=case["guidance_scale"], generator=generator,
                 max_sequence_length=case["max_sequence_length"], output_type="pt",
                 callback_on_step_end=on_step).images
    out[f"case{k}.image"] = image.float().contiguous()
    out[f"case{k}.image_u8"] = (image * 255).round().to(torch.uint8).contiguous()
    case["timesteps"] = [float(t) for t in pipe.scheduler.timesteps]
    case["shifted_sigmas"] = [float(s) for s in pipe.scheduler.sigmas]


def main():
    out_dir = sys.argv[2]
    pipe = Flux2Pipeline.from_pretrained(CHECKPOINT, torch_dtype=torch.float32)
    out = {}
    for k, case in enumerate(CASES):
        run(pipe, case, k, out)
    save_file(out, f"{out_dir}/sigmas.safetensors")
    with open(f"{out_dir}/sigmas_cases.json", "w") as f:
        json.dump(CASES, f, indent=1)
    print(json.dumps(CASES, indent=1))


if __name__ == "__main__":
    main()
