"""Tell the user what to type next; the rendered tree needs no pruning (every option is data)."""

import json

ANSWERS = json.loads(r"""{{ cookiecutter | tojson }}""")

print(
    f"""
Rendered {ANSWERS["project_slug"]}/. Next:

    cd {ANSWERS["project_slug"]}
    python -m venv .venv && . .venv/bin/activate
    pip install -e ".[dev]"
    python main.py fit --config configs/{ANSWERS["dataset"]}.yaml
"""
)
