"""Optimizers whose state lives on the device (sorted by increasing complexity)."""

from . import lr_scheduler
from .adagrad import Adadelta, Adagrad
from .adam import Adam, AdamW, adam_update
from .adamax import Adamax
from .clip import clip_grad_norm_, clip_grad_value_
from .lbfgs import LBFGS
from .nadam import NAdam, RAdam
from .optimizer import Optimizer
from .rmsprop import RMSprop
from .sgd import SGD, sgd_update

__all__ = ["SGD", "Adadelta", "Adagrad", "Adam", "AdamW", "Adamax", "LBFGS", "NAdam", "Optimizer", "RAdam", "RMSprop", "adam_update", "clip_grad_norm_",
           "clip_grad_value_", "lr_scheduler", "sgd_update"]
