"""dflash_trt._core as the torch backend uses it, with every executor it makes on the fake CUDA device
(fake_trt/fake_cuda.cpp: host memory, a stream of queued work, the decision kernels' rules compiled for the
host), and the torch graphs running on the CPU over that memory."""

import ctypes


class FakeCudaCore:
    """dflash_trt._core as torch_executor uses it, but every executor it makes is on the fake CUDA device."""

    HAS_CUDA_DEVICE = True

    def __init__(self, core, driver):
        self.core, self.driver = core, driver

    def PyGraphExecutor(self, config, graphs, device):
        config.driver_path = str(self.driver)
        graphs.use_stream = lambda handle: None  # the graphs run on the CPU, over the fake's host memory
        flush = ctypes.CDLL(str(self.driver)).fake_cuda_flush  # the stream's queued work, run in order
        open_graph = graphs.open
        graphs.open = lambda name: OnTheStream(open_graph(name), flush)
        return self.core.PyGraphExecutor(config, graphs, "cuda")


class OnTheStream:
    """A graph whose run follows the work queued on the fake stream before it, as a GPU's would."""

    def __init__(self, graph, flush):
        self.graph, self.flush = graph, flush

    def run(self, what, inputs, outputs, bindings=None):
        self.flush()
        self.graph.run(what, inputs, outputs, bindings)
