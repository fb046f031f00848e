#!/usr/bin/env python3
"""diffusers' own bf16 error on the step-cache goldens, step by step (the `e_ref` of the bf16 bar in
tests/data/README.md), made on the GPU machine (PyTorch, diffusers' carried src/).

For each case of tests/data/cache/cache_cases.json the case's pipeline (Flux2Pipeline for tiny-flux2-dev,
Flux2KleinPipeline with is_distilled false for tiny-klein) runs in bf16 on CUDA with DBCache F1B0 hooked
onto diffusers' transformer (its double and single block lists each replaced by one module that runs
block 0 and then blocks 1..N-1 or the stored residual), the golden's recorded decisions forced per list
and CFG branch, and teacher forcing: step s starts from the golden's float32 latents before step s
(cast to bf16 as the pipeline casts its latents). The velocity each step hands the scheduler (after the
CFG combination) is compared with the golden's, (latents_after_step{s} - latents before s) / dt_s, by
relative L2 error. The same run in float32 must land within the float32 bar (1e-4): it checks the hook.
Written to $OUT/bf16_reference_cache.json, committed as tests/data/cache/bf16_reference_cache.json,
keys "cache.case{k}.velocity_step{s}" (check-golden part cache_steps reads them).

usage: make_cache_references.py --diffusers DIR (diffusers' src/) --data tests/data --out FILE
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

COMPUTE, CACHED = True, False


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        if meta["dtype"] != "F32":
            continue  # image_u8: not needed here
        begin, end = meta["data_offsets"]
        out[name] = np.frombuffer(data[begin:end], dtype=np.float32).reshape(meta["shape"])
    return out


def relative_error(ours, ref):
    ours = np.asarray(ours, dtype=np.float64).ravel()
    ref = np.asarray(ref, dtype=np.float64).ravel()
    return float(np.linalg.norm(ours - ref) / np.linalg.norm(ref))


class CacheState:
    """Which forward runs now (step, CFG branch) and the forced flags per "list.branch"."""

    def __init__(self, forced, branches):
        self.forced = forced  # "double.cond" -> [bool per step], True = compute
        self.branches = branches
        self.calls = -1
        self.residuals = {}

    def next_forward(self):
        self.calls += 1

    def key(self, list_name):
        branch = "cond" if self.calls % self.branches == 0 else "uncond"
        return f"{list_name}.{branch}"

    def computes(self, list_name):
        return self.forced[self.key(list_name)][self.calls // self.branches]


def make_lists(torch, state):
    class DoubleList(torch.nn.Module):
        """The double blocks as one: block 0, then blocks 1..N-1 (M stored per stream) or x1 + M."""

        def __init__(self, blocks):
            super().__init__()
            self.blocks = blocks

        def forward(self, hidden_states, encoder_hidden_states, **kwargs):
            txt, img = self.blocks[0](hidden_states=hidden_states,
                                      encoder_hidden_states=encoder_hidden_states, **kwargs)
            key = state.key("double")
            if state.computes("double"):
                out_txt, out_img = txt, img
                for block in self.blocks[1:]:
                    out_txt, out_img = block(hidden_states=out_img, encoder_hidden_states=out_txt,
                                             **kwargs)
                state.residuals[key] = (out_txt - txt, out_img - img)
                return out_txt, out_img
            m_txt, m_img = state.residuals[key]
            return txt + m_txt, img + m_img

    class SingleList(torch.nn.Module):
        """The single blocks as one: block 0, then blocks 1..N-1 (M stored) or x1 + M."""

        def __init__(self, blocks):
            super().__init__()
            self.blocks = blocks

        def forward(self, hidden_states, **kwargs):
            x1 = self.blocks[0](hidden_states=hidden_states, **kwargs)
            key = state.key("single")
            if state.computes("single"):
                out = x1
                for block in self.blocks[1:]:
                    out = block(hidden_states=out, **kwargs)
                state.residuals[key] = out - x1
                return out
            return x1 + state.residuals[key]

    return DoubleList, SingleList


def run_case(torch, diffusers, data_dir, item, vectors, name, dtype):
    """The case's velocities (float32 numpy [N, 128] per step), teacher-forced and cache-forced."""
    cls = diffusers.Flux2Pipeline if item["pipeline"] == "dev" else diffusers.Flux2KleinPipeline
    kwargs = {} if item["pipeline"] == "dev" else {"is_distilled": item["is_distilled"]}
    pipe = cls.from_pretrained(os.path.join(data_dir, "cache", item["checkpoint"]),
                               torch_dtype=dtype, **kwargs).to("cuda")
    branches = 2 if item["pipeline"] == "klein" and not item["is_distilled"] else 1
    forced = {k: [code != 4 for code in v] for k, v in item["decisions"].items()}
    state = CacheState(forced, branches)
    DoubleList, SingleList = make_lists(torch, state)
    t = pipe.transformer
    t.transformer_blocks = torch.nn.ModuleList([DoubleList(t.transformer_blocks)])
    t.single_transformer_blocks = torch.nn.ModuleList([SingleList(t.single_transformer_blocks)])
    t.register_forward_pre_hook(lambda *_: state.next_forward())

    velocities = []
    step_function = pipe.scheduler.step

    def step(model_output, *args, **kwargs):
        velocities.append(model_output.float().cpu().numpy().reshape(-1, 128))
        return step_function(model_output, *args, **kwargs)

    pipe.scheduler.step = step

    def teacher(pipeline, i, timestep, callback_kwargs):
        golden = vectors[f"{name}.latents_after_step{i}"]
        latents = callback_kwargs["latents"]
        return {"latents": torch.from_numpy(golden.copy()).to(latents.device, latents.dtype)}

    initial = torch.from_numpy(vectors[f"{name}.initial_latents"].copy()).to("cuda", dtype)
    call = dict(prompt=item["prompt"], height=item["height"], width=item["width"],
                num_inference_steps=item["steps"], guidance_scale=item["guidance_scale"],
                max_sequence_length=item["max_sequence_length"], latents=initial,
                callback_on_step_end=teacher, output_type="latent")
    with torch.no_grad():
        pipe(**call)
    return velocities, [float(s) for s in pipe.scheduler.sigmas.cpu().numpy()]


def reference_velocities(vectors, name, steps, sigmas):
    before = vectors[f"{name}.initial_latents"][0]  # [128, h, w]
    before = before.reshape(128, -1).T  # [N, 128], row-major over (h, w) as the pipeline packs
    out = []
    for s in range(steps):
        after = vectors[f"{name}.latents_after_step{s}"].reshape(-1, 128)
        dt = np.float64(sigmas[s + 1]) - np.float64(sigmas[s])
        out.append((after.astype(np.float64) - before.astype(np.float64)) / dt)
        before = after
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--diffusers", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    sys.path.insert(0, args.diffusers)
    import torch
    import diffusers  # noqa: E402  (the carried source)

    cases = json.load(open(os.path.join(args.data, "cache", "cache_cases.json")))["cases"]
    vectors = read_safetensors(os.path.join(args.data, "cache", "cache.safetensors"))
    errors, float32_worst = {}, 0.0
    for k, item in enumerate(cases):
        name = f"case{k}"
        for dtype in (torch.float32, torch.bfloat16):
            ours, sigmas = run_case(torch, diffusers, args.data, item, vectors, name, dtype)
            refs = reference_velocities(vectors, name, item["steps"], sigmas)
            for s, (v, ref) in enumerate(zip(ours, refs)):
                error = relative_error(v, ref)
                if dtype == torch.float32:
                    float32_worst = max(float32_worst, error)
                else:
                    errors[f"cache.{name}.velocity_step{s}"] = error
        print(name, item["pipeline"], "bf16 e_ref per step:",
              [round(errors[f"cache.{name}.velocity_step{s}"], 4) for s in range(item["steps"])])
    print("float32 run, worst step error:", float32_worst)
    if float32_worst > 1e-4:
        sys.exit("the float32 run misses the float32 bar: the hook does not compute the golden")
    with open(args.out, "w") as f:
        json.dump({"what": "relative L2 error of diffusers' bf16 velocity per step of the step-cache "
                           "goldens, teacher-forced from the float32 latents, recorded decisions "
                           f"forced (tests/gpu/make_cache_references.py; torch {torch.__version__})",
                   "float32_worst": float32_worst, "errors": errors}, f, indent=1)


if __name__ == "__main__":
    main()
