import torch
import torch.nn as nn
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset

# Define a model that will be split across GPUs
class SplitModel(nn.Module):
    def __init__(self):
      super(SplitModel, self).__init__()
      self.linear1 = nn.Linear(10, 5)
      self.linear2 = nn.Linear(5, 2)


    def forward(self, x, device1, device2):
        x = x.to(device1)
        x = self.linear1(x)
        x = x.to(device2)
        x = self.linear2(x)
        return x


# Check for GPU availability and select devices
if torch.cuda.is_available():
  device0 = torch.device("cuda:0")
  if torch.cuda.device_count() > 1:
      device1 = torch.device("cuda:1")
  else:
      device1 = torch.device("cuda:0")
else:
  device0 = torch.device("cpu")
  device1 = torch.device("cpu")

# Create synthetic data
inputs = torch.randn(100, 10)
targets = torch.randn(100, 2)
dataset = TensorDataset(inputs, targets)
dataloader = DataLoader(dataset, batch_size=32)

# Instantiate the model
model = SplitModel()

# Optimizer and Loss function
optimizer = optim.SGD(model.parameters(), lr=0.01)
criterion = nn.MSELoss()

# Training Loop
for epoch in range(2):
    for batch_inputs, batch_targets in dataloader:
        batch_targets = batch_targets.to(device1)

        optimizer.zero_grad()
        outputs = model(batch_inputs, device0, device1)
        loss = criterion(outputs, batch_targets)
        loss.backward()
        optimizer.step()
    print(f"Epoch: {epoch}, Loss: {loss.item()}")
