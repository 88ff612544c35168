import json
import subprocess
import sys

import pytest
import torch

import headwise
from headwise.cli import build_parser, main
from headwise.sites import find_sites

ALL = [1] * 12


def _mask(tmp_path, rows):
    path = tmp_path / "mask.json"
    path.write_text(json.dumps({"enc-self": rows}))
    return str(path)


@pytest.mark.slow
def test_prune_with_a_mask_file_saves_a_smaller_model_that_reloads_in_a_fresh_process(tmp_path, capsys):
    rows = [[0] + ALL[1:], ALL, [0, 0] + ALL[2:], ALL, ALL, ALL]
    out = tmp_path / "out"
    assert main(["prune", "--strategy", "mask", "--mask", _mask(tmp_path, rows), "--no-eval", "--out", str(out)]) == 0
    result = json.loads((out / "pruning.json").read_text())
    assert result["heads_after"] == 69 and result["removed"]["enc-self.2"] == [0, 1]
    assert result["costs"]["before"]["parameters"] - result["costs"]["after"]["parameters"] == 3 * (3 * (32 * 384 + 32) + 384 * 32)
    assert "heads kept (1) and removed (0)" in (out / "report.html").read_text()

    model = headwise.from_pretrained(out / "model")
    assert [s.num_heads for s in find_sites(model)] == [11, 12, 10, 12, 12, 12]
    ids = torch.tensor([[101, 2023, 2003, 1037, 3231, 102]])
    with torch.no_grad():
        here = model(input_ids=ids).last_hidden_state
    code = (f"import torch, headwise; m = headwise.from_pretrained({str(out / 'model')!r}); "
            f"torch.save(m(input_ids=torch.tensor({ids.tolist()})).last_hidden_state.detach(), "
            f"{str(tmp_path / 'fresh.pt')!r})")
    subprocess.run([sys.executable, "-c", code], check=True, env={"HF_HUB_OFFLINE": "1", "PATH": ""})
    assert torch.equal(torch.load(tmp_path / "fresh.pt"), here)


@pytest.mark.slow
def test_prune_l0_runs_end_to_end_and_says_when_it_missed_its_target(tmp_path, capsys):
    """Two steps leave every gate open (they start open): the cut to --keep is by ranking, and the run says so,
    naming the flags that would help, in its output and in pruning.json."""
    out = tmp_path / "l0"
    assert main(["prune", "--strategy", "l0", "--keep", "60", "--max-steps", "2", "--no-eval", "--out", str(out)]) == 0
    result = json.loads((out / "pruning.json").read_text())
    assert result["heads_after"] == 60 and sum(map(len, result["removed"].values())) == 12
    l0 = result["l0"]
    assert l0["target_heads"] == 60 and l0["open_heads"] > 60 and l0["lambda"] >= 0
    assert "--max-steps 2" in l0["warning"] and "--epochs" in l0["warning"] and "--strategy importance" in l0["warning"]
    assert f"warning: {l0['warning']}" in capsys.readouterr().err
    assert l0["training"] == {"lam": 0.0, "reduction": "sum", "target_heads": 60, "lambda_lr": 0.01,
                              "target_warmup": 1}  # training.recipes.l0_training: half of the 2 steps


@pytest.mark.parametrize("argv,message", [
    (["--strategy", "l0"], "needs --keep"),
    (["--strategy", "importance", "--keep", "0"], "--keep: 0 is out of range"),
    (["--strategy", "mask"], "needs --mask"),
    (["--strategy", "l0", "--keep", "80", "--no-eval"], "more than the model's 72 heads"),
    (["--strategy", "l0", "--keep", "36", "--recover", "distill", "--alpha", "1.5"], "alpha 1.5"),
    (["--strategy", "l0", "--keep", "36", "--teacher", "x"], "--teacher applies to --recover distill"),
    (["--strategy", "l0", "--keep", "36", "--recover", "distill", "--finetune", "1"], "shorthand for --recover finetune"),
    (["--strategy", "l0", "--keep", "36", "--recover", "finetune", "--recover-epochs", "0"], "--recover-epochs: 0 is out of range"),
])
def test_bad_arguments(tmp_path, capsys, argv, message):
    out = tmp_path / "never"
    assert main(["prune", *argv, "--out", str(out)]) == 2
    assert message in capsys.readouterr().err and not out.exists()


def test_bad_mask_and_existing_output(tmp_path, capsys):
    out = tmp_path / "never"
    assert main(["prune", "--strategy", "mask", "--mask", _mask(tmp_path, [ALL] * 5), "--no-eval", "--out", str(out)]) == 2
    assert "5 rows" in capsys.readouterr().err and not out.exists()
    rows = [[0] * 12] + [ALL] * 5
    assert main(["prune", "--strategy", "mask", "--mask", _mask(tmp_path, rows), "--no-eval", "--out", str(out)]) == 2
    assert "--allow-empty-layers" in capsys.readouterr().err and not out.exists()
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["prune", "--strategy", "mask", "--mask", _mask(tmp_path, [ALL] * 6), "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err and (out / "keep.txt").read_text() == "mine"


def test_prune_l0_takes_how_the_gates_train():
    """L0Training's fields are prune's options; left out, training.recipes.l0_training decides."""
    args = build_parser().parse_args(["prune", "--keep", "36", "--lambda-lr", "0.5", "--reduction", "mean_over_modules"])
    assert (args.lambda_lr, args.reduction) == (0.5, "mean_over_modules") and not hasattr(args, "lam")
