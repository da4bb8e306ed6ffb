from deepspec.decoding.detokenizer import IncrementalDetokenizer
from tests.conftest import CharTokenizer


def test_streamed_text_concatenates_to_full_decode():
    tok = CharTokenizer(40)
    detok = IncrementalDetokenizer(tok.decode)
    pieces = [detok.add([i])[0] for i in range(10)]
    assert "".join(pieces) == tok.decode(list(range(10)))


def test_stop_string_cuts_text_and_reports_the_token():
    tok = CharTokenizer(40)  # token i -> chr(33 + i): 0 '!', 1 '"', 2 '#', 3 '$'
    detok = IncrementalDetokenizer(tok.decode, stop=("#$",))
    text, stop_at = detok.add([0, 1, 2, 3, 4])
    assert text == '!"' and stop_at == 3


def test_partial_stop_prefix_is_held_back_then_released():
    tok = CharTokenizer(40)
    detok = IncrementalDetokenizer(tok.decode, stop=("#$",))
    assert detok.add([0, 2]) == ("!", None)  # '#' may start the stop string
    assert detok.add([4]) == ("#%", None)
    assert detok.add([2])[0] == "" and detok.flush() == "#"


def test_a_held_back_stop_prefix_holds_back_its_whole_token():
    """A token whose text ends in a possible stop-string start is held back whole, not split: every streamed chunk
    is made of whole token texts, which is what lets a chunk carry exactly its tokens' logprobs."""
    texts = {0: "ab", 1: "x=", 2: "N", 3: "y"}
    detok = IncrementalDetokenizer(lambda ids: "".join(texts[i] for i in ids), stop=("=N",))
    assert detok.add([0, 1]) == ("ab", None)  # "x=" waits: its "=" may start "=N"
    assert detok.add([3]) == ("x=y", None)
    detok = IncrementalDetokenizer(lambda ids: "".join(texts[i] for i in ids), stop=("=N",))
    assert detok.add([1]) == ("", None) and detok.add([2]) == ("x", 0)  # the stop string completes: cut in the token
