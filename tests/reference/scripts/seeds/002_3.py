# ... other imports and setup as in Example 1 ...

accumulation_steps = 2 #adjust based on available GPU memory

for epoch in range(epochs):
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(rank), target.to(rank)
        optimizer.zero_grad()
        output = model(data)
        loss = loss_fn(output, target) / accumulation_steps
        loss.backward()
        if (batch_idx + 1) % accumulation_steps == 0:
            optimizer.step()

#... rest of the code remains similar to Example 1...
