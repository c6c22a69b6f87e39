"""The main screen and the screens and modals opened from it.

- `main`: the main screen: header, six panels, key bar
- `help`: keys and what each panel shows
- `confirm`: a yes/no question
- `pivot`: the pivot form: a cap and a floor per data arm, checked as you type
- `log`: the tail of training.log, followed while the screen is open
- `samples`: every arm's recent samples in full
- `overlay`: pick another run to overlay on the loss chart
"""
