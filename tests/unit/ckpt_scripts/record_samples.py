"""``ssdmpi train ARGS`` with every rank recording the sample indices of each batch its loader
hands out (argv: OUT, then the train arguments): ``OUT/samples-<rank>-of-<ranks>.jsonl``, one line
per batch, ``{"epoch", "step", "indices"}``."""
import json
import os
import sys

from ssdmpi.cli import main
from ssdmpi.data.loader import ShardedLoader

out = sys.argv[1]
take = ShardedLoader.next_batch


def recording(self):
    epoch, step = self.epoch, self.step_in_epoch
    with open(os.path.join(out, f"samples-{self.rank}-of-{self.world_size}.jsonl"), "a") as f:
        f.write(json.dumps({"epoch": epoch, "step": step, "indices": self.indices(epoch, step).tolist()}) + "\n")
    return take(self)


ShardedLoader.next_batch = recording
sys.exit(main(["train"] + sys.argv[2:]))
