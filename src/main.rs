fn main() {
    println!("xwarp: under construction");
}
