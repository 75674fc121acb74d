"""``ssdmpi generate RUN --prompt TEXT --tokens N [--temperature T] [--top-k K] [--seed S]``: text
sampled from a language model run's global model ``W`` (``gpt`` trained on a text dataset), by
``ssdmpi/restore.py``'s ``generate`` (``model.generate`` of ``ssdmpi.load_model``).

The prompt is encoded as the model was trained, byte-level (its UTF-8 bytes, one token each);
then, ``N`` times, as nanoGPT's ``generate``: the model reads the last ``context`` tokens, the
next token's logits are divided by the temperature, all but the ``K`` largest are dropped when
``--top-k`` is given, and the token is drawn from their softmax (``--temperature 0``: the most
likely token, no draw). The draws come from ``numpy.random.default_rng(seed)``: the same seed,
prompt and model give the same text. Prompt and continuation are decoded together (UTF-8; a
byte sequence that is not valid UTF-8 shows as U+FFFD). One process (no MPI: under mpiexec,
ranks other than 0 do nothing); no training state changes.

Imported when the CLI parser is built: what ``run`` needs is imported when it runs.
"""

from __future__ import annotations

import sys


def add_arguments(parser) -> None:
    parser.add_argument("path", metavar="RUN_OR_CHECKPOINT",
                        help="run directory (its newest checkpoint that verifies), checkpoint "
                             "(RUN/checkpoints/ckpt-<step>, best, last) or a file of one")
    parser.add_argument("--prompt", default="\n", metavar="TEXT",
                        help="the text to continue (default: a newline, as nanoGPT starts)")
    parser.add_argument("--tokens", type=int, default=200, metavar="N",
                        help="tokens (bytes) to generate (default: %(default)s)")
    parser.add_argument("--temperature", type=float, default=1.0, metavar="T",
                        help="divides the logits: below 1 more predictable, above 1 more varied, 0 always the most "
                             "likely token (default: %(default)s)")
    parser.add_argument("--top-k", type=int, metavar="K",
                        help="draw only among the K most likely tokens (default: all of them)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the draws (default: %(default)s)")
    parser.add_argument("--model", metavar="NAME|package.module:factory",
                        help="the model to load the weights into (default: the checkpoint's)")


def run(args) -> int:
    from ssdmpi.comm.abort import launcher_rank

    if launcher_rank() != 0:   # started under mpiexec by mistake: one process samples, one prints
        return 0
    from ssdmpi import checkpoint, restore

    restore.check_sampling(args.tokens, args.temperature, args.top_k, args.seed)
    model, _ = restore.from_checkpoint(checkpoint.resolve_path(args.path), model=args.model)
    text = restore.generate(model, args.prompt, args.tokens, args.temperature, args.top_k, args.seed)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()
    return 0
