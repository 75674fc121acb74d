# check_mine.py: run with  python check_mine.py  (in this directory, after train_mine.py)
import ssdmpi
from ssdmpi.data import from_arrays, load_raw

model = ssdmpi.load_model("runs/mine")   # mymodels:net rebuilt, the global weights W loaded
digits = load_raw("digits")
data = from_arrays(digits.train_images, digits.train_labels, digits.test_images, digits.test_labels)
logits = model.forward(data.test_x, train=False)   # (N, classes) on the host; inputs normalised as in training
print(f"test accuracy {(logits.argmax(axis=1) == data.test_y).mean():.2%}")
