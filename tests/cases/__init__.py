"""The tiny models of the test suite, in one place (in the style of curvlinops' ``test/cases.py``), split by job.

Every test that needs a small model builds it here, and what several test modules share lives here or in
a conftest.py fixture: no test module imports another one. ``from tests.cases import X`` and
``from tests import cases; cases.X`` reach every name below.

* :mod:`tests.cases.models` — model builders, a fresh model per call (float32, random init from torch's
  global RNG, train mode as constructed): :func:`bert`, :func:`roberta`, :func:`vit`, :func:`deit`,
  :func:`clip` (Hugging Face ``CLIPModel``), :func:`gpt2`, the decoders :func:`llama`, :func:`mistral`,
  :func:`qwen2`, :func:`gemma`, :func:`phi3` (RoPE, GQA, gated MLPs), :func:`gpt_neox` (per-head fused
  QKV, partial rotary), :func:`gptj` (interleaved RoPE), :func:`lora` (peft adapters),
  :func:`bert_classifier`; the model-soups CLIP of :mod:`geosharp_ref.io.clip_soups` (:func:`clip_soup`,
  :func:`save_clip_soup`); ``nn.MultiheadAttention`` models (:func:`mha_encoder`, :class:`MHAClassifier`,
  :class:`MHACross`, :class:`TinyAttention`, :class:`TwoLayers`); attention written by hand (:class:`GQANet`,
  :func:`qknorm_net`, :class:`RawAttention`); :func:`mlp` (no attention); diagonal linear networks
  (:func:`diagonal_net`, :func:`diagonal_regression`). Keyword arguments of the Hugging Face factories
  override the config. Constants ``ROOT``, ``DT``, ``IR``, ``SMALL``, ``CLIP_SOUP_SMALL``.
* :mod:`tests.cases.inputs` — inputs, batches and losses (:func:`ids`, :func:`text_inputs`, :func:`pixels`,
  :func:`clip_images`, :func:`bert_inputs`, :func:`cat`, :func:`lm_loss`, :func:`clip_loss`), the functional
  forward (:func:`params_of`, :func:`hidden_kw`, :func:`forward`) and orbit elements of a symmetry map
  (:func:`random_gl`, drawn with :mod:`geosharp_ref.sampling`).
* :mod:`tests.cases.tables` — the case tables :data:`SYMMETRY_CASES` (detection and outputs along orbits:
  keyword inputs of two examples, outputs with the last hidden state) and :data:`SHARPNESS_CASES` (a loss:
  batches of three examples with targets, initializer range 0.5 so attention is far from uniform) and
  :data:`DECODER_CASES` (Llama, Mistral, Qwen2, Gemma, Phi-3, GPT-NeoX, GPT-J: RoPE, GQA, gated MLPs; next-token loss).
  :func:`build` turns a case into ``(float64 model, its symmetry map)``, cached per case;
  :func:`symmetry_case` and :func:`sharpness_case` hand it out as the test modules use it.
* :mod:`tests.cases.bindings` — :data:`BINDING_CASES`: one entry per kind of binding (attention Q/K and V/O
  pairs, grouped-query attention, head translation, ReLU units, LoRA, norm scaling, declared bindings, rotary
  Q/K pairs under the RoPE subgroup, gated-MLP units), each
  with a model, a batch, its binding(s) from the public API and a change that is no symmetry.
* :mod:`tests.cases.files` — a legacy-format saved directory (:func:`save_bin`), a saved BERT backbone, the
  settings and file helpers of a tiny vision population (``POPULATION_*``, :func:`copy_population`,
  :func:`jsonl`, :func:`subprocess_env`, :func:`count_measure_runs`, :func:`recipes_in_space`), command lines
  run in this process (:func:`run_cli`) and refused (:func:`assert_refused_and_nothing_written`,
  :func:`assert_cli_refused`, :func:`assert_data_refused`, :func:`cli_error_line`),
  :func:`quiet_transformers`.
* :mod:`tests.cases.reference` — an exact trust-region solver (:func:`trust_region_max`) used as an
  independent reference, the Hessian on a quotient's horizontal space from dense float64 matrices
  (:func:`dense_horizontal_hessian`, tolerance ``DENSE_TOL``), and :func:`rel_error`.
* :mod:`tests.cases.orbits` — a model moved along every orbit of a quotient at once
  (:func:`moved_along_every_orbit`) and the joint-quotient invariance check
  (:func:`assert_invariant_along_every_orbit`).
* :mod:`tests.cases.joint` — two joint symmetries of :mod:`derivations.joint` with their derived geometry
  (:func:`norm_qk_setup`, :func:`lora_attention_setup`), random points and tangents in coordinates and the dense
  reference of the horizontal projection (:func:`dense_projection`); SymPy, so not re-exported here.
* :mod:`tests.cases.counting` — a tiny BERT classifier that counts its forward passes (:func:`counted_bert`,
  :func:`forwards_during`).

``tests/test_boundaries.py`` (g) checks that no file of the suite imports a test module.
"""
from .bindings import (BINDING_CASES, BINDING_KINDS, BINDING_NAMES, DECLARED_LORA, DECLARED_QK, BindingCase,
                       BuiltBindingCase, build_binding_case, output_at, scale_first_block, scale_first_parameter)
from .files import (POPULATION_EVAL, POPULATION_EVAL_ARGS, POPULATION_MODELS, POPULATION_TRAIN, copy_population,
                    Killed, assert_cli_refused, assert_data_refused, assert_refused_and_nothing_written, cli_error_line,
                    count_measure_runs, jsonl, kill_after_lines, quiet_transformers, recipes_in_space, run_cli,
                    save_bert_backbone, save_bin, save_llama_and_lm_data, subprocess_env)
from .inputs import (bert_inputs, cat, mlp_batch64, pixels_batch64, text_batch64, clip_images, clip_loss, forward, hidden_kw, ids, lm_loss, params_of, pixels,
                     random_gl, text_inputs)
from .models import (CLIP_SOUP_SMALL, DT, IR, ROOT, SMALL, GQAAttention, GQANet, MHAClassifier, MHACross,
                     QKNormAttention, RawAttention, TinyAttention, TwoLayers, bert, bert_classifier, clip, clip_soup,
                     deit, diagonal_net, diagonal_regression, gemma, gpt2, gpt_neox, gptj, hf_transformers, llama, lora,
                     mha_encoder,
                     mistral, mlp, mlp64, phi3, qknorm_net, qwen2, roberta, save_clip_soup, vit)
from .counting import counted_bert, forwards_during
from .orbits import assert_invariant_along_every_orbit, moved_along_every_orbit
from .reference import DENSE_TOL, dense_horizontal_hessian, rel_error, trust_region_max
from .tables import (CASES, DECODER_CASES, DECODER_NAMES, SHARPNESS_CASES, SHARPNESS_NAMES, SYMMETRY_CASES,
                     SYMMETRY_NAMES, Case, SharpnessModel, build, make, randomize_vectors, sharpness_case,
                     symmetry_case)

__all__ = [
    # models
    "ROOT", "DT", "IR", "SMALL", "CLIP_SOUP_SMALL", "hf_transformers", "bert", "lora", "bert_classifier", "roberta",
    "vit", "deit", "clip", "gpt2", "llama", "mistral", "qwen2", "gemma", "phi3", "gpt_neox", "gptj",
    "save_clip_soup", "clip_soup",
    "mha_encoder", "MHAClassifier",
    "MHACross", "TinyAttention", "TwoLayers", "GQAAttention", "GQANet", "QKNormAttention", "qknorm_net",
    "RawAttention", "mlp", "mlp64", "diagonal_net", "diagonal_regression",
    # inputs
    "clip_images", "ids", "text_inputs", "pixels", "bert_inputs", "cat", "lm_loss", "clip_loss", "params_of",
    "hidden_kw", "forward", "random_gl", "text_batch64", "mlp_batch64", "pixels_batch64",
    # tables
    "Case", "SYMMETRY_CASES", "SHARPNESS_CASES", "DECODER_CASES", "DECODER_NAMES",
    "CASES", "SYMMETRY_NAMES", "SHARPNESS_NAMES", "randomize_vectors",
    "make", "build", "symmetry_case", "SharpnessModel", "sharpness_case",
    # bindings
    "BindingCase", "BuiltBindingCase", "BINDING_CASES", "BINDING_NAMES", "BINDING_KINDS",
    "build_binding_case", "output_at", "scale_first_block", "scale_first_parameter", "DECLARED_LORA", "DECLARED_QK",
    # files
    "save_bin", "POPULATION_MODELS", "POPULATION_TRAIN", "POPULATION_EVAL", "POPULATION_EVAL_ARGS",
    "copy_population", "jsonl", "subprocess_env", "kill_after_lines", "save_bert_backbone", "save_llama_and_lm_data", "quiet_transformers",
    "assert_refused_and_nothing_written", "assert_cli_refused", "assert_data_refused", "cli_error_line", "run_cli",
    "recipes_in_space",
    # reference
    "trust_region_max", "rel_error", "dense_horizontal_hessian", "DENSE_TOL",
    # orbits, counting
    "moved_along_every_orbit", "assert_invariant_along_every_orbit", "counted_bert", "forwards_during",
]
