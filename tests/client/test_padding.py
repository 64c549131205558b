"""The one padder (claw_client/padding.py): what the padded format, collate_steps and the verl
integration lay out, checked here cell by cell against the rows it was given."""

from __future__ import annotations

import numpy as np
import pytest

from claw_client import padding

pytestmark = pytest.mark.backend_independent

PROMPTS = [[1, 2, 3], [4], [], [5, 6]]
RESPONSES = [[7], [8, 9, 10], [11, 12], []]


def test_prompts_sit_at_the_right_and_responses_at_the_left_of_their_columns():
    lay = padding.layout(PROMPTS, RESPONSES, pad_id=-7)
    # then each row's ids are where the layout says, the pad elsewhere, field by field
    assert lay.prompts.shape == (4, 3) and lay.responses.shape == (4, 3)
    for i, (p, r) in enumerate(zip(PROMPTS, RESPONSES, strict=True)):
        assert lay.prompts[i].tolist() == [-7] * (3 - len(p)) + p
        assert lay.responses[i].tolist() == r + [-7] * (3 - len(r))
        assert lay.input_ids[i].tolist() == lay.prompts[i].tolist() + lay.responses[i].tolist()
        mask = [0] * (3 - len(p)) + [1] * len(p) + [1] * len(r) + [0] * (3 - len(r))
        assert lay.attention_mask[i].tolist() == mask
        # positions count real tokens from 0, and stay 0 before the first one
        assert lay.position_ids[i].tolist() == [max(0, int(c) - 1) for c in np.cumsum(mask)]
        assert lay.response_real[i].tolist() == [True] * len(r) + [False] * (3 - len(r))
    assert lay.prompt_lengths.tolist() == [3, 1, 0, 2] and lay.response_lengths.tolist() == [1, 3, 2, 0]


def test_fixed_widths_pad_further_and_refuse_a_longer_row():
    lay = padding.layout(PROMPTS, RESPONSES, prompt_width=5, response_width=4)
    assert lay.prompts[0].tolist() == [0, 0, 1, 2, 3] and lay.responses[1].tolist() == [8, 9, 10, 0]
    with pytest.raises(ValueError, match="response_length=2"):
        padding.layout(PROMPTS, RESPONSES, response_width=2)


def test_values_per_token_keep_their_type_and_fill():
    values = [np.array([0.5]), np.array([-1.25, 2.0, 3.5]), np.array([]), np.array([])]
    out = padding.right(values, 4, fill=-1.0, dtype=np.float64)
    assert out.dtype == np.float64
    assert out.tolist() == [[0.5, -1, -1, -1], [-1.25, 2.0, 3.5, -1], [-1] * 4, [-1] * 4]
    assert padding.left([[1, 2]], 3, fill=9).tolist() == [[9, 1, 2]]


def test_an_empty_batch_is_empty_arrays():
    lay = padding.layout([], [])
    assert lay.input_ids.shape == (0, 0) and lay.attention_mask.shape == (0, 0)
