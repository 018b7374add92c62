"""The ``lightning-gnnpipe`` command line (LightningCLI), its configs, model and DataModule."""

import glob
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightning_gnnpipe.cli import main
from lightning_gnnpipe.datasets import PlanetoidChunkDataModule
from lightning_gnnpipe.models import NodeClassifier, resolve_gnn
from tests.helpers import MetricRecorder, read_metrics
from tests.world import run_world, values

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "examples" / "configs").glob("*.yaml"))


def test_console_script_is_declared():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"lightning-gnnpipe": "lightning_gnnpipe.cli:main"}


@pytest.mark.parametrize("config", CONFIGS)
def test_print_config(config, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", config, "--trainer.max_epochs=3", "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = yaml.safe_load(capsys.readouterr().out)
    source = yaml.safe_load((ROOT / config).read_text())
    assert printed["trainer"]["strategy"]["class_path"] == "lightning_gnnpipe.GNNPipeStrategy"
    assert printed["trainer"]["devices"] == 2 and printed["trainer"]["max_epochs"] == 3
    assert printed["data"]["name"] == source["data"]["name"]
    assert printed["model"]["gnn"] == source["model"]["gnn"]
    assert "in_channels" not in printed["model"]  # linked from the data


def config_fit_job(directory: str, epochs: int) -> None:
    """``examples/configs/cora_gcn.yaml`` written out by hand, fitted on this rank (a forked world's, as torchrun)."""
    from lightning.pytorch import Trainer, seed_everything

    from lightning_gnnpipe import GNNPipeStrategy

    seed_everything(0)  # as the CLI: seed, then the DataModule, the model (its widths from the data), the Trainer
    data = PlanetoidChunkDataModule("Cora", num_chunks=8)
    model = NodeClassifier(data.num_features, data.num_classes, gnn="GCN", hidden_channels=64, num_layers=4,
                           dropout=0.5, lr=0.01, weight_decay=0.0005)
    trainer = Trainer(accelerator="cpu", devices=2, strategy=GNNPipeStrategy(schedule="gpipe", balance="count"),
                      max_epochs=epochs, log_every_n_steps=1, enable_progress_bar=False, logger=False,
                      callbacks=[MetricRecorder(directory)])
    trainer.fit(model, datamodule=data)


def test_fit_from_yaml_as_a_subprocess_equals_the_same_fit_in_python(tmp_path):
    """The CLI, from the example config, trains exactly what the same objects built by hand train: the same losses and
    validation accuracies every epoch (so every option of the file reached its object)."""
    cmd = [sys.executable, "-m", "lightning_gnnpipe.cli", "fit", "--config", "examples/configs/cora_gcn.yaml",
           "--trainer.max_epochs=2", f"--trainer.default_root_dir={tmp_path}",
           f"--trainer.logger.init_args.save_dir={tmp_path}"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")  # one thread a rank, as the forked world's
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    (run_dir,) = glob.glob(str(tmp_path / "cora_gcn" / "version_*"))
    saved = yaml.safe_load(Path(run_dir, "config.yaml").read_text())
    assert saved["trainer"]["max_epochs"] == 2 and saved["data"]["num_chunks"] == 8
    assert len(glob.glob(os.path.join(run_dir, "checkpoints", "*.ckpt"))) == 1
    scalars = {}
    for f in glob.glob(os.path.join(run_dir, "events.*")):
        acc = EventAccumulator(f)
        acc.Reload()
        scalars.update({tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]})

    values(run_world(2, config_fit_job, str(tmp_path / "python"), 2, timeout=300.0))
    by_hand = read_metrics(str(tmp_path / "python"))
    assert len(by_hand) == 2 and by_hand[0]["train_loss"] != by_hand[1]["train_loss"]
    torch.testing.assert_close(scalars["train_loss"], [m["train_loss"] for m in by_hand], atol=1e-5, rtol=0)
    torch.testing.assert_close(scalars["val_acc"], [m["val_acc"] for m in by_hand], atol=1e-6, rtol=0)


def test_planetoid_datamodule_widths():
    dm = PlanetoidChunkDataModule("Cora", num_chunks=4)
    assert (dm.num_features, dm.num_classes, dm.plan.num_chunks) == (1433, 7, 4)


def test_node_classifier_builds_the_named_gnn():
    module = NodeClassifier(16, 4, gnn="GAT", hidden_channels=32, num_layers=3, gnn_kwargs={"heads": 4})
    assert type(module.gnn).__name__ == "GAT" and module.gnn.num_layers == 3
    assert resolve_gnn("torch_geometric.nn.models.GIN").__name__ == "GIN"


@pytest.mark.parametrize("gnn,error,match", [
    ("NoSuchGNN", ValueError, r"no GNN class 'NoSuchGNN'"),
    ("no_such_module.GCN", ValueError, r"no GNN class 'no_such_module.GCN'"),
    ("MLP", TypeError, r"must name a torch_geometric BasicGNN subclass \(got 'MLP'"),
])
def test_node_classifier_errors(gnn, error, match):
    with pytest.raises(error, match=match):
        resolve_gnn(gnn)
