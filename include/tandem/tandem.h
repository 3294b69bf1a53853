/* tandem — a distributed deep-learning training framework in C. This header includes every
 * public module; see each header for its purpose, ownership and thread-safety rules. */
#ifndef TANDEM_H
#define TANDEM_H

#include "tandem/status.h"
#include "tandem/core.h"
#include "tandem/tensor.h"
#include "tandem/kernels.h"
#include "tandem/autograd.h"
#include "tandem/nn.h"
#include "tandem/optim.h"
#include "tandem/safetensors.h"
#include "tandem/data.h"
#include "tandem/train.h"
#include "tandem/comm.h"
#include "tandem/comm_device.h"
#include "tandem/dp.h"
#include "tandem/checkpoint.h"
#include "tandem/sampler.h"
#include "tandem/engine.h"
#include "tandem/compress.h"
#include "tandem/plan.h"
#include "tandem/pipeline.h"
#include "tandem/cluster.h"
#include "tandem/trace.h"
#include "tandem/sim.h"

#endif
