"""claw_client is for trainers: it must import and work without Django (or torch).

README: "claw_client (no Django dependency) builds the same tree trainer-side, turns it into a
boolean SDPA mask or a FlexAttention BlockMask, and recovers per-step response logprobs from
the packed logits; a test shows they match the flat per-step forward of a small transformer
to 1e-4 in fp32." (the Django part; the rest: tests/client/test_tree_attention.py)"""

import subprocess
import sys

from tests.live import ROOT


def test_claw_client_imports_without_django_or_torch():
    # given a fresh interpreter where importing django or torch fails
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('django', 'torch', 'rest_framework'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import numpy as np\n"
        "import claw_client\n"
        "tree = claw_client.build_prefix_tree([np.array([1, 2, 3, 4], dtype='<i4'), np.array([1, 2, 5], dtype='<i4')], [2, 2])\n"
        "assert tree.stats.unique_tokens == 5, tree.stats\n"
        "body = claw_client.encode_step_batch([{'trajectory_uid': 't', 'step_index': 0, 'prompt_ids': [1], 'response_ids': [2]}])\n"
        "assert isinstance(body, bytes)\n"
        "assert 'httpx' not in sys.modules  # the HTTP client is imported on first use\n"
        "assert claw_client.ClawClient.__name__ == 'ClawClient' and claw_client.steps_to_numpy\n"
        "print('ok')\n"
    )
    # when claw_client is imported and used there
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    # then it works
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
