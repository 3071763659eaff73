#!/usr/bin/env python3
"""Forward logits of tiny random Qwen2-VL and Qwen2.5-VL models: `trainctl-trainer forward` against
HF transformers' Qwen2VLForConditionalGeneration / Qwen2_5_VLForConditionalGeneration on the same
GPU, same weights, same inputs.

Runs where torch (CUDA) and transformers are installed (the GPU machine; scripts/gpu-check.sh calls
it). Each model is HF's own random initialisation of a registry config (configs/models/tiny,
configs/models/tiny-qwen2.5-vl), saved with save_pretrained and loaded by both. Inputs: a text
batch of two sequences, the first left-padded, and image batches of random patches between text:
Qwen2-VL one (1, 4, 6)-grid image; Qwen2.5-VL one (1, 6, 10)-grid image (3 x 5 merged patches in
windows of 2 x 2 merged patches, so windows are cut at the edges) and a row holding that image and
a (1, 4, 4)-grid one. Compared at non-padding positions only, for fp32 and bf16 and for eager and
sdpa attention on both sides. --family picks one model (default: both).

Tolerances (the check fails beyond them):
  fp32: max |ours - HF| <= 1e-4 * max |HF|   (TF32 off on both sides)
  bf16: ours' error against HF's fp32 logits <= 2 x HF bf16's own error against them + 1e-3 (both
        relative to max |HF fp32|): we may round differently, not worse.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch
from safetensors.torch import load_file, save_file


FAMILIES = {
    # name: (transformers config class, model class, default registry config)
    "qwen2_vl": ("Qwen2VLConfig", "Qwen2VLForConditionalGeneration",
                 "configs/models/tiny/config.json"),
    "qwen2_5_vl": ("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration",
                   "configs/models/tiny-qwen2.5-vl/config.json"),
}


def image_row(g, cfg, grids):
    """Text, then each image of `grids` as <|vision_start|> pads <|vision_end|> and text."""
    merge = cfg.vision_config.spatial_merge_size
    parts = [torch.randint(0, 150000, (5,), generator=g)]
    for grid in grids:
        parts += [torch.tensor([cfg.vision_start_token_id]),
                  torch.full((int(grid.prod()) // merge**2,), cfg.image_token_id),
                  torch.tensor([cfg.vision_end_token_id]),
                  torch.randint(0, 150000, (7,), generator=g)]
    return torch.cat(parts).unsqueeze(0)


def make_cases(cfg, family, work):
    """The inputs: a left-padded text batch and the family's image rows (pixels saved for ours)."""
    g = torch.Generator().manual_seed(1)
    vocab = cfg.text_config.vocab_size if hasattr(cfg, "text_config") else cfg.vocab_size
    text = torch.randint(0, min(vocab, 150000), (2, 24), generator=g)
    text_mask = torch.ones_like(text)
    text_mask[0, :3] = 0
    text[0, :3] = 151643  # <|endoftext|> as padding
    cases = {"text_left_padded": dict(input_ids=text, attention_mask=text_mask)}
    image_sets = {"image": [[1, 4, 6]]}
    if family == "qwen2_5_vl":
        image_sets = {"image_windows_cut": [[1, 6, 10]],
                      "two_images": [[1, 6, 10], [1, 4, 4]]}
    vc = cfg.vision_config
    patch_dim = vc.in_channels * vc.temporal_patch_size * vc.patch_size**2
    for name, grids in image_sets.items():
        grid = torch.tensor(grids)
        ids = image_row(g, cfg, grid)
        pixels = torch.randn(int(grid.prod(-1).sum()), patch_dim, generator=g)
        pixel_file = os.path.join(work, f"pixels_{family}_{name}.safetensors")
        save_file({"pixel_values": pixels.contiguous(), "image_grid_thw": grid.to(torch.int64)},
                  pixel_file)
        cases[name] = dict(input_ids=ids, attention_mask=torch.ones_like(ids),
                           pixel_values=pixels, image_grid_thw=grid, pixel_file=pixel_file)
    return cases


def run_family(family, config_path, args):
    import transformers
    config_class, model_class, _ = FAMILIES[family]
    config_class = getattr(transformers, config_class)
    model_class = getattr(transformers, model_class)
    work = os.path.join(args.work, family)
    os.makedirs(work, exist_ok=True)
    model_dir = os.path.join(work, "model")
    cfg = config_class.from_pretrained(os.path.dirname(os.path.abspath(config_path)))
    torch.manual_seed(0)
    model_class(cfg).save_pretrained(model_dir, safe_serialization=True)
    cases = make_cases(cfg, family, work)
    image_pad = cfg.image_token_id

    def hf_logits(case, dtype, attn):
        try:
            m = model_class.from_pretrained(model_dir, dtype=dtype, attn_implementation=attn)
        except TypeError:
            m = model_class.from_pretrained(model_dir, torch_dtype=dtype, attn_implementation=attn)
        m = m.cuda().eval()
        inputs = {k: v.cuda() for k, v in cases[case].items() if k != "pixel_file"}
        with torch.no_grad():
            if "pixel_values" in inputs:
                # transformers 5 wants the processor's token types for M-RoPE: 1 marks image
                # tokens (2 would mark video ones).
                types = (inputs["input_ids"] == image_pad).long()
                try:
                    return m(**inputs, mm_token_type_ids=types).logits.float().cpu()
                except TypeError:
                    pass  # a transformers that computes them itself
            return m(**inputs).logits.float().cpu()

    def our_logits(case, dtype, attn):
        c = cases[case]
        request = {"input_ids": c["input_ids"].tolist(),
                   "attention_mask": c["attention_mask"].tolist()}
        if "pixel_file" in c:
            request["pixel_values_file"] = c["pixel_file"]
        out = os.path.join(work, f"ours_{case}_{dtype}_{attn}.safetensors")
        request_file = os.path.join(work, f"request_{case}.json")
        with open(request_file, "w") as f:
            json.dump(request, f)
        cmd = [args.trainer, "forward", "--model", model_dir, "--request", request_file,
               "--out", out, "--device", "cuda",
               "--dtype", "bfloat16" if dtype == torch.bfloat16 else "float32",
               "--attention", attn]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:2])} failed ({r.returncode}): {r.stderr[-2000:]}")
        return load_file(out)["logits"].float()

    results, ok = [], True
    for case in cases:
        keep = cases[case]["attention_mask"].bool()
        ref = hf_logits(case, torch.float32, "eager")[keep]
        scale = ref.abs().max().item()
        for dtype in (torch.float32, torch.bfloat16):
            for attn in ("eager", "sdpa"):
                t0 = time.time()
                hf = hf_logits(case, dtype, attn)[keep]
                ours = our_logits(case, dtype, attn)[keep]
                row = {"model": family, "case": case,
                       "dtype": str(dtype).replace("torch.", ""), "attention": attn,
                       "max_abs_vs_hf": (ours - hf).abs().max().item(),
                       "rel_vs_hf": (ours - hf).abs().max().item() / scale,
                       "ours_rel_err_vs_hf_fp32": (ours - ref).abs().max().item() / scale,
                       "hf_rel_err_vs_hf_fp32": (hf - ref).abs().max().item() / scale,
                       "argmax_agreement": (ours.argmax(-1) == hf.argmax(-1)).float().mean().item(),
                       "seconds": round(time.time() - t0, 2)}
                if dtype == torch.float32:
                    row["tolerance"] = "rel_vs_hf <= 1e-4"
                    row["pass"] = row["rel_vs_hf"] <= 1e-4
                else:
                    limit = 2 * row["hf_rel_err_vs_hf_fp32"] + 1e-3
                    row["tolerance"] = f"ours_rel_err_vs_hf_fp32 <= {limit:.3g}"
                    row["pass"] = row["ours_rel_err_vs_hf_fp32"] <= limit
                ok &= row["pass"]
                results.append(row)
                print(json.dumps(row), flush=True)
    return ok, results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainer", required=True)
    ap.add_argument("--family", choices=["all", *FAMILIES], default="all")
    ap.add_argument("--config", default=FAMILIES["qwen2_vl"][2], help="the Qwen2-VL config")
    ap.add_argument("--config25", default=FAMILIES["qwen2_5_vl"][2],
                    help="the Qwen2.5-VL config")
    ap.add_argument("--work", default="/tmp/hf_parity")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    configs = {"qwen2_vl": args.config, "qwen2_5_vl": args.config25}
    ok, rows = True, []
    for family in FAMILIES:
        if args.family in ("all", family):
            family_ok, family_rows = run_family(family, configs[family], args)
            ok &= family_ok
            rows += family_rows
    with open(args.out, "w") as f:
        json.dump({"pass": ok, "rows": rows,
                   "torch": torch.__version__,
                   "transformers": __import__("transformers").__version__}, f, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
