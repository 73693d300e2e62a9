"""``geosharp data``: build a data file from a text table or a folder of images, with the model's own
preprocessing (:mod:`geosharp_ref.io.datasets`), and say what was built."""
from __future__ import annotations

import sys
from pathlib import Path

from ..io.datasets import DEFAULT_MAX_LENGTH, image_dataset, text_dataset
from ..io.durable import check_output_path, save_torch_atomic
from ..io.lm_data import lm_dataset

__all__ = ["run"]

TEXT_OPTIONS = ("text_column", "text_pair_column", "label_column", "max_length", "labels")


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def _check_args(args) -> Path:
    if (args.text is None) == (args.images is None):
        given = "both" if args.text is not None else "neither"
        raise ValueError("give exactly one of --text FILE (a .csv/.tsv/.jsonl table, or .txt with --lm) and "
                         f"--images DIR (one sub-folder per class), got {given}")
    lm = getattr(args, "lm", None)
    if getattr(args, "seed", None) is not None and lm != "masked":
        raise ValueError("--seed applies only to --lm masked (it draws the masked positions)")
    if lm is not None:
        if args.images is not None:
            raise ValueError("--lm applies only to --text (language-model data is built from text)")
        given = [_option(k) for k in ("label_column", "labels", "text_pair_column") if getattr(args, k) is not None]
        if given:
            raise ValueError(f"{', '.join(given)} do not apply to --lm {lm} (the targets are the tokens "
                             f"themselves, not class labels)")
        if args.max_length is not None and args.max_length < 2:
            raise ValueError(f"--max-length must be at least 2, got {args.max_length}")
    elif args.images is not None:
        given = [_option(k) for k in TEXT_OPTIONS if getattr(args, k) is not None]
        if given:
            raise ValueError(f"{', '.join(given)} apply only to --text (with --images the class names are the "
                             f"sorted sub-folder names)")
    else:
        missing = [_option(k) for k in ("text_column", "label_column") if getattr(args, k) is None]
        if missing:
            raise ValueError(f"--text needs {' and '.join(missing)} (the columns holding the text and the labels)")
        if args.max_length is not None and args.max_length < 2:
            raise ValueError(f"--max-length must be at least 2, got {args.max_length}")
    out = Path(args.out)
    if out.is_dir():
        raise ValueError(f"--out {args.out!r} is a directory; give a file name such as {str(out / 'data.pt')!r}")
    return check_output_path(out, "--out", {"--text": args.text})


def _describe_lm(summary: dict, out: Path) -> None:
    n, L = summary["examples"], summary["max_length"]
    print(f"built {out}: {n} documents from {summary['source']} for a {summary['objective']} language model")
    src = f"column {summary['text_column']}" if summary["text_column"] else "one document per line"
    pad = " (no pad token: padded with eos)" if summary["padding"] == "eos" else ""
    print(f"  text      : {src}; tokenizer {summary['tokenizer']} of {summary['model_dir']}{pad}")
    print(f"  max length: {L} tokens (right-padded); longest document {summary['longest']} tokens")
    print(f"  truncated : {summary['truncated']} of {n} documents longer than {L} tokens "
          f"(truncation rate {summary['truncation_rate']:.1%})")
    shapes = ", ".join(f"{k} {tuple(v)}" for k, v in summary["shapes"].items())
    print(f"  inputs    : {shapes}")
    if summary["objective"] == "causal":
        how = "the next token at each position; -100 on padding and on the last position"
    else:
        how = (f"the original token at {summary['mask_prob']:.0%} of the non-special tokens (seed {summary['seed']}; "
               f"80 % mask token, 10 % random, 10 % kept); -100 elsewhere")
    print(f"  targets   : {tuple(summary['shapes']['input_ids'])}, {summary['targets']} of {summary['tokens']} "
          f"tokens scored: {how}")
    for w in summary["warnings"]:
        print(f"geosharp: warning: {w}", file=sys.stderr)


def _describe(summary: dict, out: Path) -> None:
    if summary["kind"] == "lm":
        return _describe_lm(summary, out)
    n = summary["examples"]
    print(f"built {out}: {n} {'text' if summary['kind'] == 'text' else 'image'} examples from {summary['source']}")
    if summary["kind"] == "text":
        cols = summary["text_column"] + (f" + {summary['text_pair_column']} (pairs)"
                                         if summary["text_pair_column"] else "")
        print(f"  text      : column {cols}; tokenizer {summary['tokenizer']} of {summary['model_dir']}")
        k, L = summary["truncated"], summary["max_length"]
        print(f"  max length: {L} tokens (padded); longest example {summary['longest']} tokens")
        print(f"  truncated : {k} of {n} examples longer than {L} tokens "
              f"(truncation rate {summary['truncation_rate']:.1%})")
    else:
        print(f"  images    : {summary['processor']} of {summary['model_dir']} ({summary['mode']})")
    shapes = ", ".join(f"{k} {tuple(v)}" for k, v in summary["shapes"].items())
    print(f"  inputs    : {shapes}")
    counts = summary["counts"]
    how = ("integer labels as given" if summary["classes"] is None
           else "names in index order, saved under 'labels'")
    label_src = f"column {summary['label_column']}, " if summary["kind"] == "text" else "folders, "
    print(f"  classes   : {len(counts)} ({label_src}{how})")
    width = max(len(str(c)) for c in counts)
    for i, (name, count) in enumerate(counts.items()):
        index = f"{i:>3} " if summary["classes"] is not None else ""
        print(f"    {index}{name:<{width}}  {count}")
    for w in summary["warnings"]:
        print(f"geosharp: warning: {w}", file=sys.stderr)


def run(args) -> int:
    """``geosharp data``: build the data file, write it atomically, print what it holds."""
    out = _check_args(args)
    max_length = DEFAULT_MAX_LENGTH if args.max_length is None else args.max_length
    if getattr(args, "lm", None) is not None:
        data, summary = lm_dataset(args.model_dir, args.text, args.lm, text_column=args.text_column,
                                   max_length=max_length, seed=0 if args.seed is None else args.seed)
    elif args.text is not None:
        data, summary = text_dataset(args.model_dir, args.text, args.text_column, args.label_column,
                                     text_pair_column=args.text_pair_column, max_length=max_length,
                                     labels=args.labels)
    else:
        data, summary = image_dataset(args.model_dir, args.images)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_torch_atomic(data, out)
    _describe(summary, out)
    return 0
