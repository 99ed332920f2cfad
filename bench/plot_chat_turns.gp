# plot_chat_turns.gp — TTFT per turn of `kvstash bench chat`: cache on vs off vs the floor.
# usage: gnuplot -e "csv='bench/out/chat_turns.csv'; out='docs/img/chat_turns.png'" bench/plot_chat_turns.gp
# CSV columns: 1 turn, 2 n_prompt, 3 cached_on, 4 new_on, 5 ttft_on_ms, 6 ttft_off_ms,
#              7 floor_tokens, 8 floor_ms, 9 ratio_on_floor, 10 floor_depth_ms,
#              11 ratio_on_depth, 12 speedup, 13 same_reply
if (!exists("csv")) csv = 'bench/out/chat_turns.csv'
if (!exists("out")) out = 'docs/img/chat_turns.png'
if (!exists("subtitle")) subtitle = ''

set datafile separator ','
set key autotitle columnhead
set terminal pngcairo size 960,820 font ',10'
set output out
set multiplot layout 2,1 title "kvstash bench chat: time to first token per turn\n".subtitle

# Top: TTFT, log scale.
set size 1,0.56
set origin 0,0.36
set tmargin 1
set logscale y
set ylabel 'TTFT (ms, log scale)'
set xlabel ''
set grid ytics mytics xtics
set xtics 1
set key top left opaque box
set format y '%g'
plot csv using 1:6 with linespoints lw 2 pt 7 lc rgb '#d62728' title 'cache off (whole history prefilled)', \
     csv using 1:5 with linespoints lw 2 pt 5 lc rgb '#1f77b4' title 'cache on (kvstash)', \
     csv using 1:10 with linespoints lw 2 pt 9 dt 2 lc rgb '#2ca02c' title 'floor: prefill of only the new tokens, at their depth', \
     csv using 1:($8*$4/$7) with linespoints lw 1 pt 6 dt 3 lc rgb '#7f7f7f' title 'the same tokens prefilled at depth 0'

# Bottom: cached TTFT over the floor, and the 1.2x target.
set size 1,0.36
set origin 0,0
set tmargin 1
unset logscale y
set ylabel 'cache on / floor'
set xlabel 'turn'
set yrange [0:*]
set key bottom right opaque box
plot csv using 1:11 with linespoints lw 2 pt 7 lc rgb '#1f77b4' title 'cache on / floor at depth', \
     csv using 1:9 with linespoints lw 1 pt 6 dt 3 lc rgb '#7f7f7f' title 'cache on / floor at depth 0', \
     1.2 with lines dt 2 lw 2 lc rgb '#ff7f0e' title 'target 1.2x (from turn 5)'
unset multiplot
