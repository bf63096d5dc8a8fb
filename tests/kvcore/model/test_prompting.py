"""Chat templates: the prompt ids are the tokenizer's own `apply_chat_template`, as mlx_lm.generate renders them."""

import json

import pytest

from kvcore.cli.main import main
from kvcore.engine.session import Session
from tests.model_factory import with_chat_template

TEXT = "def main(argv): return sum(x * x for x in argv)"
SYSTEM = "The quick brown fox."


@pytest.fixture(scope="module")
def chat_dir(model_dirs, tmp_path_factory):
    return with_chat_template(model_dirs["llama"], tmp_path_factory.mktemp("chat") / "llama-chat")


@pytest.fixture(scope="module")
def chat_session(chat_dir):
    return Session.load(str(chat_dir))


def test_template_is_on_by_default_and_equals_apply_chat_template(chat_session):
    tok = chat_session.tokenizer
    assert chat_session.has_chat_template and chat_session.info.has_chat_template
    messages = [{"role": "user", "content": TEXT}]
    expected = tok.apply_chat_template(messages, add_generation_prompt=True)
    out = chat_session.prefill(TEXT, n_tokens=2)
    assert out["chat_template"] and chat_session.chat_template_applied
    assert chat_session.prompt_ids == list(expected)
    assert len(expected) > len(tok.encode(TEXT))  # the template's own tokens are prompt positions
    texts = "".join(chat_session.token_texts(chat_session.prompt_ids))
    assert texts.startswith("<|user|>\n" + TEXT) and texts.endswith("<|assistant|>\n")


def test_system_prompt_comes_first(chat_session):
    tok = chat_session.tokenizer
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TEXT}]
    ids = chat_session.encode(TEXT, system_prompt=SYSTEM)
    assert ids == list(tok.apply_chat_template(messages, add_generation_prompt=True))
    assert tok.decode(ids).startswith("<|system|>\n" + SYSTEM)


def test_raw_prompt_when_off(chat_session):
    chat_session.prefill(TEXT, n_tokens=1, chat_template=False)
    assert chat_session.prompt_ids == chat_session.tokenizer.encode(TEXT)
    assert not chat_session.chat_template_applied
    with pytest.raises(ValueError, match="the chat template is off"):
        chat_session.encode(TEXT, chat_template=False, system_prompt=SYSTEM)


def test_raw_prompt_when_the_tokenizer_has_none(model_dirs, loaded_models):
    session = Session(*loaded_models["llama"][:2], info=None)
    assert not session.has_chat_template
    assert session.encode(TEXT) == loaded_models["llama"][1].encode(TEXT)
    with pytest.raises(ValueError, match="has no chat template"):
        session.encode(TEXT, system_prompt=SYSTEM)


@pytest.mark.parametrize("flags", [[], ["--no-chat-template"], ["--system-prompt", SYSTEM]])
def test_cli_chat_template_flags(chat_dir, chat_session, tmp_path, flags):
    kept = tmp_path / "kept.json"
    argv = ["compress", "--model", str(chat_dir), "-p", TEXT, "--tokens", "1", "--positions", str(kept)]
    assert main(argv + flags) == 0
    out = json.loads(kept.read_text())
    system = flags[1] if "--system-prompt" in flags else None
    assert out["chat_template"] == ("--no-chat-template" not in flags)
    assert out["prompt_tokens"] == chat_session.encode(
        TEXT, chat_template=out["chat_template"], system_prompt=system
    )


def test_cli_system_prompt_without_template_exits_2(model_dirs, tmp_path, capsys):
    kept = tmp_path / "kept.json"
    argv = ["compress", "--model", str(model_dirs["llama"]), "-p", TEXT, "--positions", str(kept)]
    assert main([*argv, "--system-prompt", SYSTEM]) == 2
    err = capsys.readouterr().err.strip()
    assert "has no chat template" in err and "drop --system-prompt" in err and "\n" not in err
    assert main([*argv, "--system-prompt", SYSTEM, "--no-chat-template"]) == 2
    assert "--system-prompt needs the chat template" in capsys.readouterr().err
    assert not kept.exists()
