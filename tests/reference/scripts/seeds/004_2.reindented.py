accumulation_steps = 4 # Accumulate 4 batches
effective_batch = batch_size * num_gpus * accumulation_steps
for i, batch in enumerate(train_loader):
    output = model(data)
    loss = criterion(output, target) / accumulation_steps
    loss.backward()
    if (i + 1) % accumulation_steps == 0:
        optimizer.step()
        optimizer.zero_grad()
