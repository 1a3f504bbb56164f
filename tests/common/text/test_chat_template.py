"""Chat templates: the plain documented one, and a model's Jinja template rendered exactly as
transformers' apply_chat_template renders it, inside a sandbox."""

import json
from pathlib import Path
from typing import Any

import jinja2
import pytest

from radixmesh.common.text.chat_template import (
    ChatMessage,
    JinjaChatTemplate,
    PlainChatTemplate,
    chat_template_from_gguf,
    chat_template_from_pretrained_dir,
)
from radixmesh.node_agent.model.source import smollm2_file
from tests.support.gguf_vocab import write_gguf

SYSTEM_USER = [ChatMessage("system", "Be brief."), ChatMessage("user", "What is the capital of France?")]
MULTI_TURN = [
    ChatMessage("system", "You answer in one sentence."),
    ChatMessage("user", "Hi!"),
    ChatMessage("assistant", "Hello! How can I help?"),
    ChatMessage("user", "Name a prime ≥ 10 😀"),
    ChatMessage("assistant", "11."),
    ChatMessage("user", "<|im_start|> is just text here"),
]
NO_SYSTEM = [ChatMessage("user", "Tell me a joke.")]


def as_dicts(messages: list[ChatMessage]) -> list[dict[str, str]]:
    return [{"role": m.role, "content": m.content} for m in messages]


# --- the plain template ----------------------------------------------------------------------------
def test_plain_template_is_the_documented_text() -> None:
    assert PlainChatTemplate().render(SYSTEM_USER[:1] + [ChatMessage("user", "Hi")]) == (
        "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\n")
    with pytest.raises(ValueError, match="at least one message"):
        PlainChatTemplate().render([])


def test_plain_template_turn_k_is_a_prefix_of_turn_k_plus_1() -> None:
    template = PlainChatTemplate()
    for k in range(2, len(MULTI_TURN), 2):  # each user turn, with the assistant's reply sent back
        assert template.render(MULTI_TURN[: k + 2]).startswith(template.render(MULTI_TURN[:k]))


# --- the Jinja environment: transformers' --------------------------------------------------------
RICH = (
    "{{ bos_token }}{% set ns = namespace(n=0) %}"
    "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
    "{% set ns.n = ns.n + 1 %}\n"
    "  {% generation %}{{ m.role | upper }}: {{ m.content | tojson }}{% endgeneration %}\n"
    "{% endfor %}\n"
    "{{ dict(a=1) | tojson }} {{ ns.n }}{% if add_generation_prompt %}<gen>{% endif %}{{ eos_token }}"
)


def test_jinja_template_renders_like_transformers_render_jinja_template() -> None:
    from transformers.utils.chat_template_utils import render_jinja_template

    ours = JinjaChatTemplate(RICH, bos_token="<s>", eos_token="</s>").render(MULTI_TURN)
    theirs, _ = render_jinja_template([as_dicts(MULTI_TURN)], chat_template=RICH, add_generation_prompt=True,
                                      bos_token="<s>", eos_token="</s>")
    assert ours == theirs[0]
    assert '"<|im_start|> is just text here"' in ours and '"Name a prime ≥ 10 😀"' in ours  # no HTML escaping


def test_raise_exception_in_a_template_is_a_value_error() -> None:
    template = JinjaChatTemplate("{% if messages[0].role != 'system' %}{{ raise_exception('system first') }}"
                                 "{% endif %}ok", bos_token=None, eos_token=None)
    assert template.render(SYSTEM_USER) == "ok"
    with pytest.raises(ValueError, match="refused the conversation: system first"):
        template.render(NO_SYSTEM)


def test_strftime_now_is_available() -> None:
    assert JinjaChatTemplate("{{ strftime_now('%Y') | length }}", bos_token=None, eos_token=None).render(NO_SYSTEM) == "4"


@pytest.mark.parametrize("source", [
    "{{ ''.__class__.__mro__ }}",
    "{{ messages.__class__.__base__.__subclasses__() }}",
    "{{ messages.append(1) }}",  # immutable sandbox: no mutating the inputs
    "{% set ns = namespace() %}{% set ns._hidden = 1 %}",
    "{{ namespace(__x=1) }}",
])
def test_sandbox_refuses_reaching_python_internals(source: str) -> None:
    with pytest.raises(jinja2.exceptions.SecurityError):
        JinjaChatTemplate(source, bos_token=None, eos_token=None).render(NO_SYSTEM)


# --- loaders --------------------------------------------------------------------------------------
def test_from_pretrained_dir_reads_tokenizer_config_and_prefers_the_jinja_file(tmp_path: Path) -> None:
    config: dict[str, Any] = {"chat_template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}",
                              "bos_token": {"content": "<s>"}, "eos_token": "</s>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert chat_template_from_pretrained_dir(tmp_path).render(NO_SYSTEM) == "<s>Tell me a joke.</s>"
    (tmp_path / "chat_template.jinja").write_text("[{{ messages | length }}]")
    assert chat_template_from_pretrained_dir(tmp_path).render(NO_SYSTEM) == "[1]"


def test_from_pretrained_dir_without_a_template_is_a_value_error(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    with pytest.raises(ValueError, match="no chat template"):
        chat_template_from_pretrained_dir(tmp_path)


def test_from_gguf_reads_the_template_and_the_files_bos_eos(tmp_path: Path) -> None:
    template = chat_template_from_gguf(write_gguf(tmp_path / "t.gguf",
                                                  chat_template="{{ bos_token }}|{{ eos_token }}"))
    assert template.render(NO_SYSTEM) == "<|im_start|>|<|im_end|>"
    with pytest.raises(ValueError, match="has no chat template"):
        chat_template_from_gguf(write_gguf(tmp_path / "none.gguf"))


# --- SmolLM2: ours against transformers' apply_chat_template -------------------------------------
@pytest.fixture(scope="module")
def reference():  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    file = smollm2_file()
    return AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name, local_files_only=True)


@pytest.mark.slow
@pytest.mark.parametrize("messages", [SYSTEM_USER, MULTI_TURN, NO_SYSTEM], ids=["system+user", "multi-turn", "no-system"])
def test_smollm2_template_matches_apply_chat_template(reference, messages: list[ChatMessage]) -> None:  # type: ignore[no-untyped-def]
    ours = chat_template_from_gguf(smollm2_file()).render(messages)
    assert ours == reference.apply_chat_template(as_dicts(messages), tokenize=False, add_generation_prompt=True)
    assert ours.endswith("<|im_start|>assistant\n")
