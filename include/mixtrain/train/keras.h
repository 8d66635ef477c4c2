// Everything a Keras program reaches for, in one include: layers, models, losses, optimizers and their
// schedules, loss scaling and dtype policies, callbacks, checkpoints, weight files and whole-model files
// (save_model, load_model, the layer registry), GradientTape, clear_session(), generate(), and the data loaders
// (CSV, Fashion-MNIST and other IDX image sets, text windows).
// docs/KERAS.md maps Keras' names to these.
#pragma once

#include "mixtrain/autograd/gradient_tape.h"
#include "mixtrain/data/csv.h"
#include "mixtrain/data/image_dataset.h"
#include "mixtrain/data/text.h"
#include "mixtrain/nn/conv_layers.h"
#include "mixtrain/nn/layer_registry.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/nn/merging.h"
#include "mixtrain/nn/normalization.h"
#include "mixtrain/nn/reshaping.h"
#include "mixtrain/nn/session.h"
#include "mixtrain/nn/swiglu.h"
#include "mixtrain/nn/transformer_layers.h"
#include "mixtrain/optim/adam.h"
#include "mixtrain/optim/rmsprop.h"
#include "mixtrain/optim/schedules.h"
#include "mixtrain/optim/sgd.h"
#include "mixtrain/precision/loss_scale_optimizer.h"
#include "mixtrain/precision/policy.h"
#include "mixtrain/train/callbacks.h"
#include "mixtrain/train/checkpoint.h"
#include "mixtrain/train/generate.h"
#include "mixtrain/train/model.h"
#include "mixtrain/train/model_file.h"
#include "mixtrain/train/weights_file.h"
