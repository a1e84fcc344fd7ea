class model_parallel(nn.Module):
  def __init__(self):
     self.sub_network1 = ...
     self.sub_network2 = ...

  def forward(x):
     x = x.cuda(0)
     x = self.sub_network1(x)
     x = x.cuda(1)
     x = self.sub_network2(x)
     return x
