"""Neural-net optimizers on flat buffers: global SGD with momentum, local updates (GLU), LR schedules."""
