parallel_net = nn.DataParallel(myNet, gpu_ids = [0,1,2])
# performs a forward pass
predictions = parallel_net(inputs)
# computes a loss function
loss = loss_function(predictions, labels)
# averages GPU-losses and performs a backward pass
