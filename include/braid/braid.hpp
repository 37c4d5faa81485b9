// braid — umbrella header: include this to use the library.
#pragma once

#include <braid/communicator.hpp>
#include <braid/config.hpp>
#include <braid/device.hpp>
#include <braid/error.hpp>
#include <braid/info.hpp>
#include <braid/metrics.hpp>
#include <braid/options.hpp>
#include <braid/store.hpp>
#include <braid/types.hpp>
#include <braid/work.hpp>
