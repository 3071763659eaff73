#!/usr/bin/env python3
"""Forward logits and greedy generation of tiny random Qwen2-VL and Qwen2.5-VL models:
`trainctl-trainer forward` and `trainctl-trainer generate` against HF transformers'
Qwen2VLForConditionalGeneration / Qwen2_5_VLForConditionalGeneration (forward, generate()) on the
same GPU, same weights, same inputs.

Runs where torch (CUDA) and transformers are installed (the GPU machine; scripts/gpu-check.sh calls
it). Each model is HF's own random initialisation of a registry config (configs/models/tiny,
configs/models/tiny-qwen2.5-vl), saved with save_pretrained and loaded by both. Inputs: a text
batch of two sequences, the first left-padded, and image batches of random patches between text:
Qwen2-VL one (1, 4, 6)-grid image; Qwen2.5-VL one (1, 6, 10)-grid image (3 x 5 merged patches in
windows of 2 x 2 merged patches, so windows are cut at the edges) and a row holding that image and
a (1, 4, 4)-grid one. Compared at non-padding positions only, for fp32 and bf16 and for eager and
sdpa attention on both sides. --family picks one model (default: both).

Generation: the same prompts plus a text batch of one, fp32, eager and sdpa, greedy (generate()
with do_sample=False), --max-new-tokens new tokens (default 16). Both sides stop a row at the eos
ids our tool reads from the saved model directory (generate_tool.h: generation_config.json's
eos_token_id, else config.json's, else <|im_end|> and <|endoftext|>), given to HF as eos_token_id
with the same pad_token_id; HF's rows are cut after their first eos, as ours end there.

Tolerances (the check fails beyond them):
  fp32: max |ours - HF| <= 1e-4 * max |HF|   (TF32 off on both sides)
  bf16: ours' error against HF's fp32 logits <= 2 x HF bf16's own error against them + 1e-3 (both
        relative to max |HF fp32|): we may round differently, not worse.
  generation: the new ids equal exactly, row by row (a row's first differing position is reported,
        with HF's logit margin there of its token over ours).

Output JSON: {"pass", "logits_pass", "rows" (logits), "generation_pass", "generation" (rows;
one whose side failed to run holds "error"), "torch", "transformers"}.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch
from safetensors.torch import load_file, save_file


# Qwen2-VL's <|im_end|> and <|endoftext|>: our generate tool's eos ids when the model names none.
DEFAULT_EOS = [151645, 151643]
END_OF_TEXT = 151643

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


def load_hf(model_class, model_dir, dtype, attn):
    try:
        m = model_class.from_pretrained(model_dir, dtype=dtype, attn_implementation=attn)
    except TypeError:
        m = model_class.from_pretrained(model_dir, torch_dtype=dtype, attn_implementation=attn)
    return m.cuda().eval()


def write_request(case, path):
    """The request file of `trainctl-trainer forward` and `generate` (tool_request.h)."""
    request = {"input_ids": case["input_ids"].tolist(),
               "attention_mask": case["attention_mask"].tolist()}
    if "pixel_file" in case:
        request["pixel_values_file"] = case["pixel_file"]
    with open(path, "w") as f:
        json.dump(request, f)


def run_trainer(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:2])} failed ({r.returncode}): {r.stderr[-2000:]}")


def ids_at(path, key):
    """An id or a list of ids at `key` of the JSON object in `path`; [] when absent or malformed
    (generate_tool.cc's IdsAt)."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return []
    value = doc.get(key) if isinstance(doc, dict) else None
    values = value if isinstance(value, list) else [value]
    if value is None or value == [] or not all(is_id(v) for v in values):
        return []
    return values


def is_id(v):
    return isinstance(v, int) and not isinstance(v, bool)


def special_tokens(model_dir):
    """The eos ids and pad id our generate tool uses for `model_dir` (ReadSpecialTokens)."""
    files = [os.path.join(model_dir, n) for n in ("generation_config.json", "config.json")]
    eos = ids_at(files[0], "eos_token_id") or ids_at(files[1], "eos_token_id") or DEFAULT_EOS
    pad = ids_at(files[0], "pad_token_id") or ids_at(files[1], "pad_token_id")
    return eos, pad[0] if len(pad) == 1 and pad[0] >= 0 else END_OF_TEXT


def generation_cases(cases):
    """The logits cases' prompts, after a text batch of one (the padded batch's unpadded row)."""
    one = cases["text_left_padded"]["input_ids"][1:2]
    return {"text_one": dict(input_ids=one, attention_mask=torch.ones_like(one)), **cases}


def hf_generate(model, case, image_pad, eos, pad, new_tokens):
    """HF's greedy new ids per row (up to max_new_tokens, eos rows padded) and its scores
    [rows, steps, vocab]."""
    inputs = {k: v.cuda() for k, v in case.items() if k != "pixel_file"}
    kw = dict(do_sample=False, num_beams=1, max_new_tokens=new_tokens, eos_token_id=eos,
              pad_token_id=pad, use_cache=True, return_dict_in_generate=True, output_scores=True)
    extra = {}
    if "pixel_values" in inputs:  # M-RoPE's token types, as in hf_logits
        extra["mm_token_type_ids"] = (inputs["input_ids"] == image_pad).long()
    try:
        out = model.generate(**inputs, **extra, **kw)
    except (TypeError, ValueError) as e:
        if not extra or "mm_token_type_ids" not in str(e):
            raise
        out = model.generate(**inputs, **kw)  # a transformers that computes them itself
    new = out.sequences[:, inputs["input_ids"].shape[1]:].tolist()
    return new, torch.stack(out.scores, 1).float().cpu()


def cut_at_eos(row, eos):
    """The row up to and including its first eos id, and whether it had one."""
    for i, token in enumerate(row):
        if token in eos:
            return row[:i + 1], True
    return row, False


def first_diff(ours, hf, scores):
    """None when the rows are equal, else the first differing row and position, the tokens there
    (None past a row's end) and HF's logit margin of its token over ours."""
    for r, (a, b) in enumerate(zip(ours, hf)):
        if a == b:
            continue
        p = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        ours_tok = a[p] if p < len(a) else None
        hf_tok = b[p] if p < len(b) else None
        gap = None
        if ours_tok is not None and hf_tok is not None:
            gap = (scores[r, p, hf_tok] - scores[r, p, ours_tok]).item()
        return {"row": r, "position": p, "ours": ours_tok, "hf": hf_tok, "hf_logit_margin": gap}
    if len(ours) != len(hf):
        return {"row": min(len(ours), len(hf)), "position": 0, "ours": None, "hf": None,
                "hf_logit_margin": None}
    return None


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
        m = load_hf(model_class, model_dir, dtype, attn)
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
        out = os.path.join(work, f"ours_{case}_{dtype}_{attn}.safetensors")
        request_file = os.path.join(work, f"request_{case}.json")
        write_request(cases[case], request_file)
        run_trainer([args.trainer, "forward", "--model", model_dir, "--request", request_file,
                     "--out", out, "--device", "cuda",
                     "--dtype", "bfloat16" if dtype == torch.bfloat16 else "float32",
                     "--attention", attn])
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
    gen_ok, gen_rows = compare_generation(family, model_class, model_dir, cases, image_pad, args)
    return ok, results, gen_ok, gen_rows


def our_generate(args, model_dir, name, case, attn):
    """`trainctl-trainer generate`, greedy, fp32: its new ids per row and stopped flags."""
    work = os.path.dirname(model_dir)  # the family's folder
    request_file = os.path.join(work, f"gen_request_{name}.json")
    out = os.path.join(work, f"gen_ours_{name}_{attn}.json")
    write_request(case, request_file)
    run_trainer([args.trainer, "generate", "--model", model_dir, "--request", request_file,
                 "--out", out, "--max_new_tokens", str(args.max_new_tokens), "--device", "cuda",
                 "--dtype", "float32", "--attention", attn])
    with open(out) as f:
        result = json.load(f)
    return result["generated"], result["stopped"]


def generation_row(family, name, case, attn, model_class, model_dir, image_pad, args):
    """One prompt batch greedily generated by both sides (a fresh HF model: no rope_deltas left
    from an earlier call), compared id for id."""
    t0 = time.time()
    eos, pad = special_tokens(model_dir)
    model = load_hf(model_class, model_dir, torch.float32, attn)
    new, scores = hf_generate(model, case, image_pad, eos, pad, args.max_new_tokens)
    cut = [cut_at_eos(row, eos) for row in new]
    hf, hf_stopped = [c[0] for c in cut], [c[1] for c in cut]
    ours, ours_stopped = our_generate(args, model_dir, name, case, attn)
    diff = first_diff(ours, hf, scores)
    return {"model": family, "case": name, "dtype": "float32", "attention": attn,
            "batch": len(new), "max_new_tokens": args.max_new_tokens, "eos_token_ids": eos,
            "pad_token_id": pad, "ours": ours, "hf": hf, "ours_stopped": ours_stopped,
            "hf_stopped": hf_stopped, "first_diff": diff, "tolerance": "new ids equal",
            "pass": diff is None and list(ours_stopped) == hf_stopped,
            "seconds": round(time.time() - t0, 2)}


def compare_generation(family, model_class, model_dir, cases, image_pad, args):
    """Every generation case, eager and sdpa; a side that fails is a failed row, so that the
    logits rows still reach the output."""
    rows, ok = [], True
    for name, case in generation_cases(cases).items():
        for attn in ("eager", "sdpa"):
            try:
                row = generation_row(family, name, case, attn, model_class, model_dir, image_pad,
                                     args)
            except Exception as e:  # noqa: BLE001 - recorded as a failure
                row = {"model": family, "case": name, "dtype": "float32", "attention": attn,
                       "error": f"{type(e).__name__}: {e}"[-2000:], "pass": False}
            ok &= row["pass"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    return ok, rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainer", required=True)
    ap.add_argument("--family", choices=["all", *FAMILIES], default="all")
    ap.add_argument("--config", default=FAMILIES["qwen2_vl"][2], help="the Qwen2-VL config")
    ap.add_argument("--config25", default=FAMILIES["qwen2_5_vl"][2],
                    help="the Qwen2.5-VL config")
    ap.add_argument("--max-new-tokens", type=int, default=16,
                    help="new tokens per row in the generation comparison")
    ap.add_argument("--work", default="/tmp/hf_parity")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    configs = {"qwen2_vl": args.config, "qwen2_5_vl": args.config25}
    ok, rows, gen_ok, gen_rows = True, [], True, []
    for family in FAMILIES:
        if args.family in ("all", family):
            family_ok, family_rows, family_gen_ok, family_gen_rows = run_family(
                family, configs[family], args)
            ok &= family_ok
            rows += family_rows
            gen_ok &= family_gen_ok
            gen_rows += family_gen_rows
    with open(args.out, "w") as f:
        json.dump({"pass": ok and gen_ok, "logits_pass": ok, "rows": rows,
                   "generation_pass": gen_ok, "generation": gen_rows,
                   "torch": torch.__version__,
                   "transformers": __import__("transformers").__version__}, f, indent=2)
    return 0 if ok and gen_ok else 1


if __name__ == "__main__":
    sys.exit(main())
