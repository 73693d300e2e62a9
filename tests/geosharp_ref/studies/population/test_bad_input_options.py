"""Population commands check every option once, before anything is read, computed or written
(docs/reference/errors.md): zero, negative, infinite or absurd numbers, a one-model population; a refused run
leaves no settings file behind, so the corrected run is not refused as "other settings". JSON files and records
of the wrong type or with missing fields are refused in one line that says which file and what to do."""
import json
import shutil

import pytest

from tests import cases

EVAL = cases.POPULATION_EVAL_ARGS


def _refused(capsys, argv, root, needles, out=None):
    cases.assert_cli_refused(capsys, argv, root, out or root / "absent", needles)


def _with(args, option, *values):
    """``args`` with ``option``'s values replaced (or appended)."""
    args = list(args)
    if option in args:
        i = args.index(option) + 1
        j = i
        while j < len(args) and not args[j].startswith("--"):
            j += 1
        args[i:j] = list(values)
    else:
        args += [option, *values]
    return args


EVALUATE_CASES = {  # option, values, what the line says
    "iters 0 (used to record every sharpness as 0.0)": ("--iters", ["0"], "--iters (Auto-PGD iterations, n_iter) "
                                                                          "must be a positive integer, got 0"),
    "negative batches": ("--batches", ["-1"], "--batches (n_batches) must be a positive integer, got -1"),
    "zero batch size": ("--batch-size", ["0"], "--batch-size must be a positive integer, got 0"),
    "infinite rho": ("--rho", ["0.01", "inf"], "every radius ρ must be a positive finite number"),
    "rho above the largest accepted (used to fail at the model's first unit)": (
        "--rho", ["0.01", "200"], "every radius ρ must be at most 100, the largest radius an evaluation accepts"),
    "zero threads": ("--threads", ["0"], "--threads must be a positive integer, got 0"),
    "more examples than the pool": ("--batches", ["1000"], "1000 batches × 16 = 16000 needed"),
    "zero length buckets": ("--length-buckets", ["0"], "--length-buckets must be a positive integer, got 0"),
    "length buckets on images": ("--length-buckets", ["2"], "length buckets need padded text"),
    "curvature options without a curvature measure": ("--probes", ["4"], "--probes set the curvature measures "
                                                                         "(hessian-*), and --measures names none"),
    "zero probes": ("--probes", ["0", "--measures", "hessian-trace-mix"], "--probes must be a positive integer"),
    "zero Lanczos steps": ("--lanczos-steps", ["0", "--measures", "hessian-top-eigenvalue-mix"],
                           "--lanczos-steps must be a positive integer"),
    "Hutch++ with 2 matvecs": ("--trace-method", ["hutch++", "--probes", "2", "--measures", "hessian-trace-inv"],
                               "Hutch++ (--trace-method hutch++) needs at least 3 matvecs"),
}


@pytest.mark.parametrize("case", sorted(EVALUATE_CASES))
def test_evaluate_options_refused_before_its_settings_are_written(trained, tmp_path, capsys, case):
    out = cases.copy_population(trained, tmp_path)
    option, values, needle = EVALUATE_CASES[case]
    _refused(capsys, ["population", "evaluate", "--out", out, *_with(EVAL, option, *values)], tmp_path, [needle])


def test_the_corrected_run_after_a_refusal_matches_the_reference(trained, reference, tmp_path, capsys):
    """A refused run used to leave evaluation.json behind, and the corrected run was then refused as "other
    settings"; now it runs and gives exactly the uninterrupted evaluation's results."""
    out = cases.copy_population(trained, tmp_path)
    argv = ["population", "evaluate", "--out", out]
    _refused(capsys, argv + _with(EVAL, "--iters", "0"), tmp_path, ["--iters"])
    rc, _, err = cases.run_cli(capsys, argv + EVAL)
    assert rc == 0, err
    assert (out / "results.jsonl").read_bytes() == (reference / "results.jsonl").read_bytes()


OTHER_CASES = {  # argv after `population`, what the line says (OUT is the population's copy, NEW a new directory)
    "calibrate: a target size above 1": (["calibrate", "--out", "OUT", "--sizes", "2"], "target relative size 2 is "
                                                                                         "above 1"),
    "calibrate: zero batch size": (["calibrate", "--out", "OUT", "--sizes", "1e-3", "--batch-size", "0"],
                                   "--batch-size must be a positive integer"),
    "calibrate: an infinite probe": (["calibrate", "--out", "OUT", "--sizes", "1e-3", "--probe-rho", "0.01", "inf"],
                                     "two distinct positive finite probe radii"),
    "calibrate: length buckets on images": (["calibrate", "--out", "OUT", "--sizes", "1e-3", "--length-buckets", "2"],
                                            "length buckets need padded text"),
    "calibrate: zero threads": (["calibrate", "--out", "OUT", "--sizes", "1e-3", "--threads", "0"],
                                "--threads must be a positive integer"),
    "reliability: zero threads": (["reliability", "--out", "OUT", "--threads", "0"], "--threads must be a positive"),
    "train: zero epochs": (["train", "--out", "NEW", "--models", "3", "--epochs-max", "0"],
                           "--epochs-max must be a positive integer"),
    "train: zero training examples": (["train", "--out", "NEW", "--models", "3", "--train-size-max", "0"],
                                      "--train-size-max must be a positive integer"),
    "train: zero workers": (["train", "--out", "NEW", "--models", "3", "--workers", "0"],
                            "--workers must be a positive integer"),
    "train: one model": (["train", "--out", "NEW", "--models", "1"], "--models 1: a population ranks its models"),
    "study: two models": (["study", "--out", "NEW", "--models", "2"], "give at least 3 (a study ends in a Kendall τ"),
    "study: zero iterations": (["study", "--out", "NEW", "--models", "3", "--iters", "0"],
                               "--iters must be a positive integer"),
    "reliability: zero halvings": (["reliability", "--out", "OUT", "--splits", "0"], "--splits must be a positive"),
    "correlate: zero resamples": (["correlate", "--out", "OUT", "--bootstrap", "0"], "--bootstrap must be a positive"),
    "rebuild: zero workers": (["rebuild", "--out", "OUT", "--workers", "0"], "--workers must be a positive"),
    "pipeline: zero workers": (["pipeline", "--out", "OUT", "--plan", "PLAN.json", "--workers", "0"],
                               "--workers must be a positive"),
}


@pytest.mark.parametrize("case", sorted(OTHER_CASES))
def test_other_population_options_refused_before_anything_is_written(trained, tmp_path, capsys, case):
    out = cases.copy_population(trained, tmp_path)
    argv, needle = OTHER_CASES[case]
    argv = [str(out) if a == "OUT" else str(tmp_path / "new" / "pop") if a == "NEW" else a for a in argv]
    quiet = [] if argv[0] == "correlate" else ["--no-progress"]
    _refused(capsys, ["population", *argv, *quiet], tmp_path, [needle])
    assert not (tmp_path / "new").exists()


def test_a_one_model_import_is_refused(trained, tmp_path, capsys):
    metrics = tmp_path / "m.csv"
    metrics.write_text("model,gap\nmodel_000,0.1\n")
    new = tmp_path / "imported"
    _refused(capsys, ["population", "import", "--out", new, "--models", trained / "models" / "model_000", "--metrics",
                      metrics, "--data", tmp_path / "absent.pt"], tmp_path, ["--models names 1 model"], out=new)


def _evaluated(reference, tmp_path):
    out = tmp_path / "vit"
    shutil.copytree(reference, out)
    return out


JSON_CASES = {  # file, new content, command after `population`, what the line says
    "a results line that is a list": (
        "results.jsonl", lambda text: text + "[1, 2]\n", ["correlate", "--bootstrap", "20", "--no-plot"],
        ["results.jsonl: record 5 is not a result line", "delete that line"]),
    "a results line without values": (
        "results.jsonl", lambda text: '{"model": "model_009"}\n' + text, ["correlate", "--bootstrap", "20", "--no-plot"],
        ["record 1 is not a result line (expected a JSON object with 'model' and 'values'"]),
    "a results line with a missing radius": (
        "results.jsonl", lambda text: text.split("\n", 1)[0].replace('"0.05": ', '"0.5": ') + "\n" + text.split(
            "\n", 1)[1],
        ["correlate", "--bootstrap", "20", "--no-plot"], ["the record of model_000 has no finite value for"]),
    "a finished-measure line without its values": (
        "results.units/rank0.jsonl", lambda text: '{"model": "model_000", "measure": "adaptive"}\n',
        ["evaluate", *EVAL], ["results.units/rank0.jsonl: line 1 is not a finished measure of a model"]),
    "evaluation settings that are a list": (
        "evaluation.json", lambda text: "[]", ["correlate", "--bootstrap", "20", "--no-plot"],
        ["evaluation.json should hold the evaluation settings as a JSON object, but holds a list"]),
    "evaluation settings without radii": (
        "evaluation.json", lambda text: json.dumps({"measures": ["adaptive"]}), ["correlate", "--bootstrap", "20"],
        ["does not hold evaluation settings"]),
    "a calibration without its grid": (
        "calibration.json", lambda text: json.dumps({"settings": {"sizes": [1e-3]}}),
        ["evaluate", "--calibration", "--tag", "cal", *EVAL[EVAL.index("--batches"):]],
        ["calibration.json should hold the calibration, but lacks ['grid']"]),
    "a calibration grid of the wrong length": (
        "calibration.json", lambda text: json.dumps({"settings": {"sizes": [1e-3]}, "grid": {"adaptive": [0.1, 0.2]}}),
        ["evaluate", "--calibration", "--tag", "cal", *EVAL[EVAL.index("--batches"):]],
        ["'grid' must map every calibrated measure to 1 positive radii"]),
    "a calibration grid beyond the largest radius": (
        "calibration.json", lambda text: json.dumps({"settings": {"sizes": [1e-3]}, "grid": {"adaptive": [200.0]}}),
        ["evaluate", "--calibration", "--tag", "cal", *EVAL[EVAL.index("--batches"):]],
        ["'grid' must map every calibrated measure to 1 positive radii of at most 100"]),
    "a reliability file that is a number": (
        "reliability.json", lambda text: "3", ["correlate", "--bootstrap", "20", "--no-plot"],
        ["reliability.json should hold the split-half reliability of the gaps as a JSON object, but holds a number"]),
    "test predictions that are not class indices": (
        "test_predictions.jsonl", lambda text: '{"model": "model_000", "predictions": "abc"}\n',
        ["reliability", "--splits", "5", "--no-progress"],
        ["test_predictions.jsonl: record 1 is not a model's test predictions", "delete that line"]),
    "a manifest entry without a name": (
        "population.json", lambda text: json.dumps({**json.loads(text), "models": [{"dir": "models/model_000"}]}),
        ["evaluate", *EVAL], ["models[0] is not a model entry"]),
    "an imported entry without a path": (
        "population.json", lambda text: json.dumps({**json.loads(text), "models": [
            {"name": "a", "loader": "hf", "metrics": {"gap": 0.1}}]}),
        ["evaluate", *EVAL], ["models[0] ('a') is an imported model without a 'path'"]),
    "a manifest entry without a gap": (
        "population.json", lambda text: json.dumps({**json.loads(text), "models": [
            {"name": "a", "dir": "models/model_000", "metrics": {"gap": None}}]}),
        ["evaluate", *EVAL], ["models[0] ('a') has no finite metrics.gap"]),
}


@pytest.mark.parametrize("case", sorted(JSON_CASES))
def test_json_files_of_the_wrong_type_or_with_missing_fields(reference, tmp_path, capsys, case):
    name, change, argv, needles = JSON_CASES[case]
    out = _evaluated(reference, tmp_path)
    path = out / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(change(path.read_text() if path.is_file() else ""))
    _refused(capsys, ["population", argv[0], "--out", out, *argv[1:]], tmp_path, needles)
