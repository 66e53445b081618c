import sys; sys.path.insert(0, __import__("os").path.dirname(__file__))
import tensorrt_rtx as trt; from proto import model_nonpad
lg = trt.Logger(trt.Logger.ERROR); b = trt.Builder(lg); net = b.create_network(0); p = trt.OnnxParser(net, lg); p.parse(model_nonpad())
users = [(net.get_layer(i).name, str(net.get_layer(i).type)) for i in range(net.num_layers) for j in range(net.get_layer(i).num_inputs)
         if net.get_layer(i).get_input(j) is not None and net.get_layer(i).get_input(j).name == "nonpad_kv_seqlen"]
print("layers consuming nonpad_kv_seqlen:", users)
for i in range(net.num_layers):
    l = net.get_layer(i)
    if "ATTENTION" in str(l.type):
        print(l.name, l.type, [x for x in dir(l) if not x.startswith("_")][:40]); break
