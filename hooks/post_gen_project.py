"""Tell the user what to type next; the rendered tree needs no pruning (every option is data).

The message goes to stderr, so that tools which render the template to compare trees and print
the difference on stdout (``cruft diff``) show only the difference.
"""

import json
import sys

ANSWERS = json.loads(r"""{{ cookiecutter | tojson }}""")

print(
    f"""
Rendered {ANSWERS["project_slug"]}/. Next:

    cd {ANSWERS["project_slug"]}
    python -m venv .venv && . .venv/bin/activate
    pip install -c constraints.txt -e ".[dev]"    # CPU only: see README.md, Install
    python main.py fit --config configs/{ANSWERS["dataset"]}.yaml
""",
    file=sys.stderr,
)
