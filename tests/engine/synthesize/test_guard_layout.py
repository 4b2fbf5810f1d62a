"""A guarded rewrite moves the original statements one block deeper. A line that the move pushes
past the repository's line length is laid out again; a line the file already held past that
length stays as written (the repository lives with it, and laying it out anew would only add
churn to the pull request's diff), in both branches of the `if`."""

from __future__ import annotations

from engine.scan import scan_source, select_rules

SOURCE = '''
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.scale = dim ** -0.5

    def forward(self, query_states, key_states, value_states_of_heads, output_attentions=False):
        # the similarity of every query to every key, scaled by the inverse root of the dimension
        scores = torch.matmul(query_states, key_states.transpose(-1, -2)) * self.scale  # the raw attention logits, one per pair
        attention_probabilities_of_every_query = scores.softmax(dim=-1)
        attention_output_all = torch.matmul(attention_probabilities_of_every_query, value_states_of_heads).contiguous()
        if output_attentions:
            return attention_output_all, attention_probabilities_of_every_query
        return attention_output_all, None
'''

LIMIT = 120  # what the file is evidently written to (engine/synthesize/style.py)


def test_moved_lines_are_laid_out_only_where_the_move_breaks_the_limit():
    over = "scores = torch.matmul(query_states, key_states.transpose(-1, -2)) * self.scale  # the raw attention logits, one per pair"
    fits = "attention_output_all = torch.matmul(attention_probabilities_of_every_query, value_states_of_heads).contiguous()"
    assert len("        " + over) > LIMIT >= len("        " + fits) and len("            " + fits) > LIMIT
    [finding], new = scan_source(SOURCE, select_rules("sdpa-attention"))
    assert finding.status == "guarded", finding.reason
    lines = new.splitlines()
    # the line already over the limit: moved as written, not wrapped around its comment
    assert "            " + over in lines
    # the line the move pushed over: laid out again, and every new line of the `if` fits
    assert "            " + fits not in lines
    added = [line for line in lines if line not in SOURCE.splitlines()]
    assert added and all(len(line) <= LIMIT for line in added if over not in line), added
    # the comment that still fits one block deeper is kept whole
    assert "            # the similarity of every query to every key, scaled by the inverse root of the dimension" in lines
