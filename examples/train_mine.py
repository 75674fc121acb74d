# train_mine.py: run with  mpiexec -n 4 python train_mine.py  (in this directory)
from mymodels import net  # your model: mymodels.py, next to this script

import ssdmpi
from ssdmpi.data import load_raw

digits = load_raw("digits")             # stands in for your arrays: images (N, 1, 8, 8) in [0, 1], labels (N,)
train_x, train_y, test_x, test_y = digits.train_images, digits.train_labels, digits.test_images, digits.test_labels

result = ssdmpi.train({"algo": "ssd", "delay": 5, "epochs": 10, "batch_size": 32, "lr": 0.05,
                       "run_dir": "runs/mine"},
                      model=net, dataset=(train_x, train_y, test_x, test_y))
print(result.exit_code, result.summary["test_acc"])   # every rank gets both
model = result.model                                  # the trained Model, W in its parameters
