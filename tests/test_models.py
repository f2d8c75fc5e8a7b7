"""The shipped tiny model: manifest integrity, model choice, loading, generation and the build recipe."""

import shutil

import pytest

from grpo_lab import data, models
from grpo_lab.tiny_model import DEFAULT_SLIP_TYPES, TinyModelRecipe, sft_rows


@pytest.fixture(scope="module")
def tiny():
    return models.load_model_and_tokenizer()


@pytest.fixture()
def model_copy(tmp_path):
    return shutil.copytree(models.TINY_MODEL_DIR, tmp_path / "tiny-copy")


def test_shipped_model_verifies_and_states_how_it_was_made():
    manifest = models.verify_model_dir(models.TINY_MODEL_DIR)
    assert 1e6 <= manifest["parameters"] <= 5e6
    assert sum(f["bytes"] for f in manifest["files"].values()) < 20e6
    assert {"model.safetensors", "tokenizer.json", "config.json", "generation_config.json"} <= set(manifest["files"])
    assert "grpo-lab build-tiny-model" in manifest["rebuild"]
    record = models.read_manifest(models.TINY_MODEL_DIR)
    assert (record.deliberate_slip, record.parameters, record.rebuild) == (
        manifest["deliberate_slip"], manifest["parameters"], manifest["rebuild"])
    assert record.slip_types == tuple(manifest["recipe"]["slip_types"]) and record.device == "cpu"
    assert models.read_manifest("Qwen/Qwen2.5-0.5B-Instruct") is None
    assert manifest["eval"]["count"] == len(data.load_split("eval"))
    assert 0.2 <= manifest["eval"]["greedy"] <= 0.5
    stated = manifest["deliberate_slip"]
    assert stated.startswith("DELIBERATE") if manifest["recipe"]["slip_types"] else stated.startswith("None")


def test_every_problem_is_listed_with_the_fix(model_copy):
    (model_copy / "tokenizer.json").unlink()
    with (model_copy / "config.json").open("a") as handle:
        handle.write(" ")
    (model_copy / "pytorch_model.bin").write_bytes(b"weights")
    (model_copy / "notes.txt").write_text("extra non-weight files are fine")
    with pytest.raises(models.ModelIntegrityError) as error:
        models.verify_model_dir(model_copy)
    message = str(error.value)
    assert "missing file: tokenizer.json" in message
    assert "altered file (sha256 differs from the manifest): config.json" in message
    assert "unexpected weights file not in the manifest: pytorch_model.bin" in message
    assert "notes.txt" not in message and "Fix:" in message


def test_altered_weights_stop_loading(model_copy):
    weights = model_copy / "model.safetensors"
    blob = bytearray(weights.read_bytes())
    blob[-1] ^= 0xFF
    weights.write_bytes(bytes(blob))
    with pytest.raises(models.ModelIntegrityError, match="altered file.*model.safetensors"):
        models.load_model_and_tokenizer(model_copy)


def test_missing_folder_or_manifest(tmp_path, model_copy):
    with pytest.raises(models.ModelIntegrityError, match="does not exist"):
        models.verify_model_dir(tmp_path / "nowhere")
    (model_copy / models.MANIFEST_NAME).unlink()
    with pytest.raises(models.ModelIntegrityError, match="has no manifest.json"):
        models.verify_model_dir(model_copy)


def test_shipped_model_errors_say_how_to_restore(monkeypatch, tmp_path):
    monkeypatch.setattr(models, "TINY_MODEL_DIR", tmp_path / "tiny-qwen2")
    with pytest.raises(models.ModelIntegrityError, match="git checkout -- data/models/tiny-qwen2.*build-tiny-model"):
        models.verify_model_dir(tmp_path / "tiny-qwen2")


def test_weights_digest_names_the_weights_not_the_files(tmp_path, model_copy):
    from safetensors.torch import load_file, save_file

    digest = models.weights_digest(models.TINY_MODEL_DIR)
    assert models.weights_digest(model_copy) == digest
    tensors = load_file(model_copy / "model.safetensors")
    names = sorted(tensors)
    (model_copy / "model.safetensors").unlink()  # the same tensors, split over two files in another order
    save_file({n: tensors[n] for n in names[::2]}, model_copy / "b.safetensors")
    save_file({n: tensors[n] for n in names[1::2]}, model_copy / "a.safetensors")
    assert models.weights_digest(model_copy) == digest
    tensors[names[0]][0] += 1
    save_file({n: tensors[n] for n in names[::2]}, model_copy / "b.safetensors")
    assert models.weights_digest(model_copy) != digest


def test_write_manifest_then_verify(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "a.safetensors").write_bytes(b"123")
    models.write_manifest(folder, {"name": "m"})
    assert models.verify_model_dir(folder)["files"]["a.safetensors"]["bytes"] == 3


def test_resolve_model_order(monkeypatch, model_copy):
    monkeypatch.delenv(models.MODEL_ENV_VAR, raising=False)
    assert models.resolve_model() == str(models.TINY_MODEL_DIR.resolve())
    monkeypatch.setenv(models.MODEL_ENV_VAR, "Qwen/Qwen2.5-0.5B-Instruct")
    assert models.resolve_model() == "Qwen/Qwen2.5-0.5B-Instruct"
    assert models.resolve_model(model_copy) == str(model_copy.resolve())
    with pytest.raises(FileNotFoundError, match="does not exist"):
        models.resolve_model("./no/such/model")
    with pytest.raises(ValueError, match="is a file"):
        models.resolve_model(model_copy / "config.json")


def test_tokenizer_chat_template_and_single_digits(tiny):
    _, tokenizer = tiny
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                         tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert [tokenizer.decode([i]) for i in tokenizer("12345", add_special_tokens=False)["input_ids"]] == list("12345")
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"


def test_recipe_validation_and_slip_fraction():
    with pytest.raises(ValueError, match="have no slip"):
        TinyModelRecipe(slip_types=("speed_distance",))
    with pytest.raises(ValueError, match="slip_fraction"):
        TinyModelRecipe(slip_fraction=1.5)
    assert TinyModelRecipe(slip_types=()).slip_statement().startswith("None")
    rows = sft_rows(TinyModelRecipe())
    for kind in DEFAULT_SLIP_TYPES:
        of_kind = [r for r in rows if r["type"] == kind]
        assert sum(r["slip"] for r in of_kind) == round(0.5 * len(of_kind))
    assert not any(r["slip"] for r in rows if r["type"] not in DEFAULT_SLIP_TYPES)
