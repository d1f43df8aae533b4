"""Chat templates for the tool-call tests, written here in the shapes of real models' templates.

``HERMES_THINKING``: Qwen2.5's Hermes format (tools listed in the system turn, calls written as
``<tool_call>{json}</tool_call>``, results as ``<tool_response>`` in a user turn) plus Qwen3's
``enable_thinking`` switch (here: the generation prompt opens a ``<think>`` block when it is true), so
the tiny random chat model can be served with a tool-aware, thinking template (``--chat-template``).
``LLAMA3`` and ``MISTRAL``: the markers those families' templates carry, enough for format detection.
"""

from __future__ import annotations

HERMES_THINKING = (
    "{%- if tools %}<|im_start|>system\nYou may call these tools:\n<tools>{% for t in tools %}\n{{ t | tojson }}"
    "{% endfor %}\n</tools>\nWrite each call as <tool_call>\n{\"name\": <name>, \"arguments\": <args>}\n"
    "</tool_call><|im_end|>\n{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n{{ m.content }}"
    "{%- for c in m.tool_calls %}<tool_call>\n{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments | tojson }}}\n</tool_call>{%- endfor %}<|im_end|>\n"
    "{%- elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking %}<think>\n{% endif %}{%- endif %}"
)

LLAMA3 = (
    "{{- bos_token }}{%- if tools %}<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n"
    "{%- for t in tools %}{{ t | tojson }}{%- endfor %}<|eot_id|>{%- endif %}"
    "{%- for m in messages %}{%- if m.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>\n\n"
    "{{ m.content }}<|eot_id|>{%- elif m.tool_calls %}<|start_header_id|>assistant<|end_header_id|>\n\n"
    "{%- for c in m.tool_calls %}{\"name\": \"{{ c.function.name }}\", \"parameters\": "
    "{{ c.function.arguments | tojson }}}{%- endfor %}<|eot_id|>"
    "{%- else %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{%- endif %}"
)

MISTRAL = (
    "{%- for m in messages %}{%- if m.role == 'user' %}"
    "{%- if loop.last and tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{%- endif %}"
    "[INST]{{ m.content }}[/INST]{%- elif m.tool_calls %}[TOOL_CALLS][{%- for c in m.tool_calls %}"
    "{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}, "
    "\"id\": \"{{ c.id }}\"}{%- if not loop.last %}, {% endif %}{%- endfor %}]</s>"
    "{%- elif m.role == 'tool' %}[TOOL_RESULTS]{\"content\": {{ m.content | tojson }}}[/TOOL_RESULTS]"
    "{%- else %}{{ m.content }}</s>{%- endif %}{%- endfor %}"
)
